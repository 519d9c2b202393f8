// SPDX-License-Identifier: Apache-2.0

package kevent

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/magnet-tracer/magnet/internal/trace"
)

// usdtProbe is one USDT probe site of a binary, from its .note.stapsdt.
type usdtProbe struct {
	Provider, Name string
	Offset         uint64 // file offset of the probe's instruction
	Semaphore      uint64 // file offset of its semaphore; 0: none
	Args           string // e.g. "8@%rbx -4@112(%rsp)"
}

// readUSDT lists the USDT probes of the ELF file at path.
func readUSDT(path string) ([]usdtProbe, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	notes := f.Section(".note.stapsdt")
	if notes == nil {
		return nil, nil
	}
	data, err := notes.Data()
	if err != nil {
		return nil, fmt.Errorf("read %s's probe notes: %w", path, err)
	}
	var baseAddr uint64
	if b := f.Section(".stapsdt.base"); b != nil {
		baseAddr = b.Addr
	}
	order := f.ByteOrder
	var out []usdtProbe
	for len(data) >= 12 {
		namesz, descsz, typ := order.Uint32(data), order.Uint32(data[4:]), order.Uint32(data[8:])
		nameEnd := 12 + align4(int(namesz))
		descEnd := nameEnd + align4(int(descsz))
		if namesz > 1<<16 || descsz > 1<<16 || descEnd > len(data) {
			return nil, fmt.Errorf("%s: bad probe note", path)
		}
		name, desc := data[12:12+namesz], data[nameEnd:nameEnd+int(descsz)]
		data = data[descEnd:]
		if typ != 3 || string(bytes.TrimRight(name, "\x00")) != "stapsdt" || len(desc) < 24 {
			continue
		}
		pc, base, sem := order.Uint64(desc), order.Uint64(desc[8:]), order.Uint64(desc[16:])
		strs := strings.SplitN(string(desc[24:]), "\x00", 4)
		if len(strs) < 3 {
			continue
		}
		if baseAddr != 0 {
			// Prelinked: the note's addresses moved with the sections.
			pc += baseAddr - base
			if sem != 0 {
				sem += baseAddr - base
			}
		}
		p := usdtProbe{Provider: strs[0], Name: strs[1], Args: strs[2]}
		if p.Offset, err = fileOffset(f, pc); err != nil {
			return nil, fmt.Errorf("%s: probe %s:%s: %w", path, p.Provider, p.Name, err)
		}
		if sem != 0 {
			if p.Semaphore, err = fileOffset(f, sem); err != nil {
				return nil, fmt.Errorf("%s: probe %s:%s's semaphore: %w", path, p.Provider, p.Name, err)
			}
		}
		out = append(out, p)
	}
	return out, nil
}

func align4(n int) int { return (n + 3) &^ 3 }

// fileOffset turns a virtual address of f into its offset in the file.
func fileOffset(f *elf.File, addr uint64) (uint64, error) {
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && addr >= p.Vaddr && addr < p.Vaddr+p.Memsz {
			return addr - p.Vaddr + p.Off, nil
		}
	}
	return 0, fmt.Errorf("address %#x is in no loaded segment", addr)
}

// x86RegOff is the offset in x86-64's struct pt_regs of each register, by
// every name an argument may give it.
var x86RegOff = func() map[string]uint16 {
	m := map[string]uint16{}
	for _, r := range []struct {
		off   uint16
		names string
	}{
		{0, "r15 r15d r15w r15b"}, {8, "r14 r14d r14w r14b"}, {16, "r13 r13d r13w r13b"}, {24, "r12 r12d r12w r12b"},
		{32, "rbp ebp bp bpl"}, {40, "rbx ebx bx bl bh"}, {48, "r11 r11d r11w r11b"}, {56, "r10 r10d r10w r10b"},
		{64, "r9 r9d r9w r9b"}, {72, "r8 r8d r8w r8b"}, {80, "rax eax ax al ah"}, {88, "rcx ecx cx cl ch"},
		{96, "rdx edx dx dl dh"}, {104, "rsi esi si sil"}, {112, "rdi edi di dil"}, {128, "rip eip ip"},
		{152, "rsp esp sp spl"},
	} {
		for _, n := range strings.Fields(r.names) {
			m[n] = r.off
		}
	}
	return m
}()

// parseUSDTArgs parses a probe's argument string (SystemTap's x86 form:
// SIZE@%REG, SIZE@DISP(%REG), SIZE@$CONST).
func parseUSDTArgs(s string) ([]keventKevArg, error) {
	var out []keventKevArg
	for _, a := range strings.Fields(s) {
		if len(out) == 6 {
			return nil, errors.New("more than 6 arguments")
		}
		sz, op, ok := strings.Cut(a, "@")
		if !ok {
			return nil, fmt.Errorf("argument %q: no size", a)
		}
		n, err := strconv.Atoi(sz)
		if err != nil || (abs(n) != 1 && abs(n) != 2 && abs(n) != 4 && abs(n) != 8) {
			return nil, fmt.Errorf("argument %q: bad size", a)
		}
		arg := keventKevArg{Size: int8(n)}
		switch {
		case strings.HasPrefix(op, "$"):
			v, err := strconv.ParseInt(op[1:], 0, 64)
			if err != nil {
				return nil, fmt.Errorf("argument %q: bad constant", a)
			}
			arg.Kind, arg.Disp = 3, v
		case strings.HasPrefix(op, "%"):
			off, ok := x86RegOff[op[1:]]
			if !ok {
				return nil, fmt.Errorf("argument %q: unknown register", a)
			}
			arg.Kind, arg.Reg = 1, off
		case strings.HasSuffix(op, ")"):
			i := strings.IndexByte(op, '(')
			if i < 0 || strings.Contains(op[i:], ",") || !strings.HasPrefix(op[i+1:], "%") {
				return nil, fmt.Errorf("argument %q: only DISP(%%REG) addresses are supported", a)
			}
			off, ok := x86RegOff[op[i+2:len(op)-1]]
			if !ok {
				return nil, fmt.Errorf("argument %q: unknown register", a)
			}
			var disp int64
			if i > 0 {
				if disp, err = strconv.ParseInt(op[:i], 0, 32); err != nil {
					return nil, fmt.Errorf("argument %q: bad displacement", a)
				}
			}
			arg.Kind, arg.Reg, arg.Disp = 2, off, disp
		default:
			return nil, fmt.Errorf("argument %q: not understood", a)
		}
		out = append(out, arg)
	}
	return out, nil
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

// planUSDT finds the probe in its binary and lays its record out: one
// 8-byte field per argument, arg0..argN, signed where the note says so.
func (ev *Event) planUSDT() error {
	if a := pmu("uprobe", "CONFIG_UPROBE_EVENTS"); !a.Available {
		return fmt.Errorf("%s: %s", ev.Spec, a.Why)
	}
	probes, err := readUSDT(ev.Spec.Binary)
	if err != nil {
		return fmt.Errorf("%s: %w", ev.Spec, err)
	}
	var found []usdtProbe
	var names []string
	for _, p := range probes {
		if p.Provider == ev.Spec.Provider && p.Name == ev.Spec.Name {
			found = append(found, p)
		}
		names = append(names, p.Provider+":"+p.Name)
	}
	switch {
	case len(found) == 0 && len(probes) == 0:
		return fmt.Errorf("%s: the binary has no USDT probes", ev.Spec)
	case len(found) == 0:
		if len(names) > 12 {
			names = append(names[:12], "...")
		}
		return fmt.Errorf("%s: no such probe (the binary has %s)", ev.Spec, strings.Join(names, ", "))
	case len(found) > 1:
		// Inlined into several places: each would be a probe of its own.
		return fmt.Errorf("%s: the probe is at %d places, of which magnet records one only: not supported", ev.Spec, len(found))
	}
	p := found[0]
	if ev.args, err = parseUSDTArgs(p.Args); err != nil {
		return fmt.Errorf("%s: %w", ev.Spec, err)
	}
	ev.usdt = p
	for i, a := range ev.args {
		kind := trace.KindUint
		if a.Size < 0 {
			kind = trace.KindInt
		}
		ev.Type.Fields = append(ev.Type.Fields, trace.Field{Name: "arg" + strconv.Itoa(i), Offset: trace.CommonSize + 8*i, Size: 8, Kind: kind, CType: p.Args})
	}
	ev.Type.Size = trace.CommonSize + 6*8
	return nil
}
