// SPDX-License-Identifier: Apache-2.0

package overhead

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
)

// progCounts are the kernel's bpf_stats of one BPF program: its runs and
// the time spent in its body (counted only while bpf_stats is enabled).
type progCounts struct {
	Name, Type  string
	RunNs, Runs uint64
}

// processProgs reads the bpf_stats of every BPF program process pid holds
// open, by program id, from /proc/PID/fdinfo (a link's fdinfo names its
// program too but has no counts: only program descriptors are read).
func processProgs(pid int) (map[uint32]progCounts, error) {
	dir := fmt.Sprintf("/proc/%d/fdinfo", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("bpf programs of %d: %w", pid, err)
	}
	out := map[uint32]progCounts{}
	for _, e := range ents {
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		id, c, ok := parseProgFdinfo(f)
		f.Close()
		if ok {
			// Named now: the programs go with the process.
			c.Name = progName(id)
			out[id] = c
		}
	}
	return out, nil
}

// parseProgFdinfo reads a BPF program descriptor's fdinfo; ok is false for
// any other descriptor.
func parseProgFdinfo(r io.Reader) (id uint32, c progCounts, ok bool) {
	var haveID, haveRuns bool
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		k, v, found := strings.Cut(sc.Text(), ":")
		if !found {
			continue
		}
		v = strings.TrimSpace(v)
		switch k {
		case "prog_type":
			c.Type = v
			if n, err := strconv.ParseUint(v, 10, 32); err == nil {
				c.Type = ebpf.ProgramType(n).String()
			}
		case "prog_id":
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				return 0, progCounts{}, false
			}
			id, haveID = uint32(n), true
		case "run_time_ns":
			c.RunNs, _ = strconv.ParseUint(v, 10, 64)
		case "run_cnt":
			c.Runs, _ = strconv.ParseUint(v, 10, 64)
			haveRuns = true
		case "link_type", "link_id":
			return 0, progCounts{}, false
		}
	}
	return id, c, haveID && haveRuns
}

// ProgStat is one program's bpf_stats over a transfer.
type ProgStat struct {
	Name     string  `json:"name"`
	Type     string  `json:"type"`
	Runs     uint64  `json:"runs"`
	NsPerRun float64 `json:"ns_per_run"`
	// NsPerGB is its body's time per GB the workload received.
	NsPerGB float64 `json:"ns_per_gb"`
}

// progDiff turns two readings into per-program figures, busiest first.
func progDiff(before, after map[uint32]progCounts, gb float64) []ProgStat {
	var out []ProgStat
	for id, a := range after {
		b := before[id]
		if a.Runs < b.Runs || a.RunNs < b.RunNs {
			continue
		}
		runs, ns := a.Runs-b.Runs, a.RunNs-b.RunNs
		if runs == 0 {
			continue
		}
		st := ProgStat{Name: a.Name, Type: a.Type, Runs: runs, NsPerRun: float64(ns) / float64(runs)}
		if gb > 0 {
			st.NsPerGB = float64(ns) / gb
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].NsPerGB != out[j].NsPerGB {
			return out[i].NsPerGB > out[j].NsPerGB
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// progName is the program's name as the kernel keeps it (at most 15
// characters), or its id if it cannot be looked up.
func progName(id uint32) string {
	p, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
	if err != nil {
		return fmt.Sprintf("prog %d", id)
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil || info.Name == "" {
		return fmt.Sprintf("prog %d", id)
	}
	return info.Name
}
