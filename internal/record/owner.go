// SPDX-License-Identifier: Apache-2.0

package record

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/magnet-tracer/magnet/internal/sockowner"
)

// A socket that already existed when the probes were attached is first
// seen wherever its next packet or call finds it. A listener's first sight
// is a SYN, in a softirq, where the current task has nothing to do with the
// socket: its conn_open names no task (tid 0), and the connection table
// would have no owner for it, since a listener never sends or receives.
// owners finds the owner as ss -p does: the socket's inode from the
// namespace's /proc/net table, then the process holding a descriptor of
// that inode.

// Offsets in struct mg_conn_open (bpf/events.h).
const (
	connProto  = 32
	connFamily = 33
	connState  = 34
	connLport  = 36
	connRport  = 38
	connLaddr  = 40
	connRaddr  = 56
	connSize   = 72
	tcpListen  = 10 // enum tcp_state TCP_LISTEN
	protoTCP   = 6
	protoUDP   = 17
	procNetTCP = "tcp"
	procNetUDP = "udp"
)

// owner is the process that holds a socket.
type owner struct {
	pid uint32
	key taskKey
}

// owners resolves, and remembers, the owners of sockets first seen with no
// task.
type owners struct {
	proc  string            // where procfs is mounted
	cache map[uint64]*owner // by socket cookie; nil: not found
}

func newOwners(proc string) *owners {
	return &owners{proc: proc, cache: map[uint64]*owner{}}
}

// of returns the owner of the socket that conn_open record ev announces,
// if ev names no task and the socket is a TCP listener or a UDP socket
// (the sockets found by their addresses alone). It runs once per socket,
// on the control ring's path: a scan of /proc costs milliseconds, too much
// for the events' drain, but a socket is announced once.
func (o *owners) of(ev []byte) (*owner, bool) {
	if len(ev) < connSize || binary.NativeEndian.Uint32(ev[16:20]) != 0 {
		return nil, false
	}
	proto, state := ev[connProto], ev[connState]
	if !(proto == protoTCP && state == tcpListen) && proto != protoUDP {
		return nil, false
	}
	cookie := binary.NativeEndian.Uint64(ev[8:16])
	if w, ok := o.cache[cookie]; ok {
		return w, w != nil
	}
	v6 := ev[connFamily] == 6
	local := netip.AddrPortFrom(addrOf(ev[connLaddr:connLaddr+16], v6), binary.NativeEndian.Uint16(ev[connLport:]))
	remote := netip.AddrPortFrom(addrOf(ev[connRaddr:connRaddr+16], v6), binary.NativeEndian.Uint16(ev[connRport:]))
	table := procNetTCP
	if proto == protoUDP {
		table = procNetUDP
	}
	if v6 {
		table += "6"
	}
	w, err := o.find(binary.NativeEndian.Uint32(ev[24:28]), table, local, remote, proto == protoTCP)
	if err != nil {
		w = nil
	}
	o.cache[cookie] = w
	return w, w != nil
}

func addrOf(b []byte, v6 bool) netip.Addr {
	if v6 {
		return netip.AddrFrom16([16]byte(b))
	}
	return netip.AddrFrom4([4]byte(b[:4]))
}

// find returns the owner of the socket of /proc/net/<table> in network
// namespace netns whose local address is local and whose remote one is
// remote (TCP: a listener, whose remote is always 0.0.0.0:0).
func (o *owners) find(netns uint32, table string, local, remote netip.AddrPort, listener bool) (*owner, error) {
	inNS, others, err := o.pidsByNetNS(netns)
	if err != nil {
		return nil, err
	}
	// Any process of the namespace shows its tables; the first may exit
	// meanwhile.
	var inode uint64
	found := false
	for _, pid := range inNS {
		f, err := os.Open(filepath.Join(o.proc, strconv.Itoa(pid), "net", table))
		if err != nil {
			continue
		}
		inode, found, err = socketInode(f, local, remote, listener)
		f.Close()
		if err == nil {
			break
		}
	}
	if !found || inode == 0 {
		return nil, fmt.Errorf("no socket %s in /proc/net/%s of netns %d", local, table, netns)
	}
	// The owner is most likely in the socket's namespace; a descriptor
	// passed to a process of another one is looked for after.
	holders := o.holders(inNS, inode)
	if len(holders) == 0 {
		holders = o.holders(others, inode)
	}
	if len(holders) == 0 {
		return nil, fmt.Errorf("no process holds socket inode %d", inode)
	}
	return o.describe(sockowner.Oldest(holders, func(pid int) int { return sockowner.Parent(o.proc, pid) }))
}

// pidsByNetNS lists the processes of network namespace netns, then the
// others.
func (o *owners) pidsByNetNS(netns uint32) (in, others []int, err error) {
	ents, err := os.ReadDir(o.proc)
	if err != nil {
		return nil, nil, fmt.Errorf("list processes: %w", err)
	}
	want := fmt.Sprintf("net:[%d]", netns)
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ns, err := os.Readlink(filepath.Join(o.proc, e.Name(), "ns", "net"))
		if err != nil {
			continue
		}
		if ns == want {
			in = append(in, pid)
		} else {
			others = append(others, pid)
		}
	}
	return in, others, nil
}

// socketInode reads a /proc/net/{tcp,udp}{,6} table and returns the inode
// of the socket bound to local, connected to remote and, if listener, in
// state LISTEN.
func socketInode(f *os.File, local, remote netip.AddrPort, listener bool) (uint64, bool, error) {
	sc := bufio.NewScanner(f)
	sc.Scan() // the heading
	for sc.Scan() {
		e, ok := parseProcNetLine(sc.Text())
		if !ok {
			continue
		}
		if listener && e.state != tcpListen {
			continue
		}
		if e.local == local && e.remote == remote {
			return e.inode, true, nil
		}
	}
	return 0, false, sc.Err()
}

// procNetEntry is one socket of a /proc/net/{tcp,udp}{,6} table.
type procNetEntry struct {
	local, remote netip.AddrPort
	state         uint8
	inode         uint64
}

// parseProcNetLine parses one line of a /proc/net/{tcp,udp}{,6} table
// ("sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt
// uid timeout inode ...").
func parseProcNetLine(line string) (procNetEntry, bool) {
	var e procNetEntry
	fs := strings.Fields(line)
	if len(fs) < 10 {
		return e, false
	}
	var ok1, ok2 bool
	e.local, ok1 = parseProcNetAddr(fs[1])
	e.remote, ok2 = parseProcNetAddr(fs[2])
	st, err1 := strconv.ParseUint(fs[3], 16, 8)
	ino, err2 := strconv.ParseUint(fs[9], 10, 64)
	if !ok1 || !ok2 || err1 != nil || err2 != nil {
		return e, false
	}
	e.state, e.inode = uint8(st), ino
	return e, true
}

// parseProcNetAddr parses "ADDR:PORT" of /proc/net: the address is printed
// 32 bits at a time, each word as the host's %08X of network-order bytes.
func parseProcNetAddr(s string) (netip.AddrPort, bool) {
	a, p, ok := strings.Cut(s, ":")
	if !ok || (len(a) != 8 && len(a) != 32) {
		return netip.AddrPort{}, false
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, false
	}
	raw, err := hex.DecodeString(a)
	if err != nil {
		return netip.AddrPort{}, false
	}
	var b [16]byte
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(b[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	if len(raw) == 4 {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[:4])), uint16(port)), true
	}
	return netip.AddrPortFrom(netip.AddrFrom16(b), uint16(port)), true
}

// holders returns the processes of pids with a descriptor of socket inode.
func (o *owners) holders(pids []int, inode uint64) []int {
	want := fmt.Sprintf("socket:[%d]", inode)
	var out []int
	for _, pid := range pids {
		dir := filepath.Join(o.proc, strconv.Itoa(pid), "fd")
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && l == want {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

// describe returns process pid as the owner the recorder writes: its main
// thread (tid = pid), real uid and name, as the probes see a task.
func (o *owners) describe(pid int) (*owner, error) {
	p, err := sockowner.Describe(o.proc, pid)
	if err != nil {
		return nil, err
	}
	w := &owner{pid: p.PID}
	w.key.pid = p.PID
	w.key.uid = p.UID
	copy(w.key.comm[:15], p.Comm)
	return w, nil
}
