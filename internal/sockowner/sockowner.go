// SPDX-License-Identifier: Apache-2.0

// Package sockowner finds, in one walk of /proc, the process that owns
// each socket of the host (as ss -p does: the process holding a descriptor
// of the socket's inode) and the network namespaces the host's processes
// live in, and runs a function inside a network namespace.
//
// The recorder learns the sockets that exist when it starts all at once:
// looking each socket's owner up by its own scan of /proc cost about 4 ms a
// socket, a walk for all of them costs about as much as one such scan.
package sockowner

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Process is a socket's owner as the probes name a task: its main thread
// (tid = pid), real uid and name.
type Process struct {
	PID  uint32
	UID  uint32
	Comm string
}

// Table is what one walk of /proc found.
type Table struct {
	// Owners maps a socket inode to its owner: among the processes holding
	// it, the one whose parent does not (nginx's master, not the workers
	// it forked with the listener), the lowest pid if several.
	Owners map[uint64]Process
	// NetNS maps each network namespace a process lives in, and each one
	// bound under /run/netns (ip netns), by inode, to a path that opens it.
	NetNS map[uint32]string
	// Processes is how many processes the walk read.
	Processes int
}

// Walk reads /proc (mounted at proc) once. Processes that exit during the
// walk are skipped.
func Walk(proc string) (*Table, error) {
	ents, err := os.ReadDir(proc)
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	t := &Table{Owners: map[uint64]Process{}, NetNS: map[uint32]string{}}
	holders := map[uint64][]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		dir := filepath.Join(proc, e.Name())
		fds, err := os.ReadDir(filepath.Join(dir, "fd"))
		if err != nil {
			continue
		}
		t.Processes++
		if ns, ok := nsInode(filepath.Join(dir, "ns", "net")); ok {
			if _, seen := t.NetNS[ns]; !seen {
				t.NetNS[ns] = filepath.Join(dir, "ns", "net")
			}
		}
		for _, fd := range fds {
			l, err := os.Readlink(filepath.Join(dir, "fd", fd.Name()))
			if err != nil {
				continue
			}
			if ino, ok := socketInode(l); ok {
				if h := holders[ino]; len(h) == 0 || h[len(h)-1] != pid {
					holders[ino] = append(h, pid)
				}
			}
		}
	}
	addBoundNetNS(t.NetNS, "/run/netns")
	described := map[int]*Process{}
	parents := map[int]int{}
	parent := func(pid int) int {
		p, ok := parents[pid]
		if !ok {
			p = Parent(proc, pid)
			parents[pid] = p
		}
		return p
	}
	for ino, pids := range holders {
		pid := Oldest(pids, parent)
		p, ok := described[pid]
		if !ok {
			if d, err := Describe(proc, pid); err == nil {
				p = &d
			}
			described[pid] = p
		}
		if p != nil {
			t.Owners[ino] = *p
		}
	}
	return t, nil
}

// socketInode parses a descriptor's link, "socket:[INODE]".
func socketInode(link string) (uint64, bool) {
	s, ok := strings.CutPrefix(link, "socket:[")
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, "]")
	if !ok {
		return 0, false
	}
	ino, err := strconv.ParseUint(s, 10, 64)
	return ino, err == nil && ino != 0
}

// nsInode returns the inode of the namespace file at path.
func nsInode(path string) (uint32, bool) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, false
	}
	return uint32(st.Ino), true
}

// addBoundNetNS adds the namespaces bound under dir (`ip netns add`),
// which may have no process.
func addBoundNetNS(ns map[uint32]string, dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		if ino, ok := nsInode(p); ok {
			if _, seen := ns[ino]; !seen {
				ns[ino] = p
			}
		}
	}
}

// Oldest picks the owner among the processes that hold a socket: the one
// whose parent is not among them, the lowest pid if several. pids is
// sorted in place.
func Oldest(pids []int, parent func(int) int) int {
	if len(pids) == 1 {
		return pids[0]
	}
	slices.Sort(pids)
	for _, pid := range pids {
		if _, in := slices.BinarySearch(pids, parent(pid)); !in {
			return pid
		}
	}
	return pids[0]
}

// Parent returns process pid's parent, 0 if unknown.
func Parent(proc string, pid int) int {
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0
	}
	// "pid (comm) state ppid ...": comm may hold spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	fs := strings.Fields(s[i+1:])
	if len(fs) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(fs[1])
	return ppid
}

// Describe returns process pid as the probes see a task: its real uid and
// name.
func Describe(proc string, pid int) (Process, error) {
	dir := filepath.Join(proc, strconv.Itoa(pid))
	comm, err := os.ReadFile(filepath.Join(dir, "comm"))
	if err != nil {
		return Process{}, fmt.Errorf("read owner's name: %w", err)
	}
	status, err := os.ReadFile(filepath.Join(dir, "status"))
	if err != nil {
		return Process{}, fmt.Errorf("read owner's status: %w", err)
	}
	p := Process{PID: uint32(pid), Comm: strings.TrimSuffix(string(comm), "\n")}
	for _, l := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(l, "Uid:"); ok {
			if fs := strings.Fields(rest); len(fs) > 0 {
				uid, err := strconv.ParseUint(fs[0], 10, 32)
				if err != nil {
					return Process{}, fmt.Errorf("owner's uid %q: %w", fs[0], err)
				}
				p.UID = uint32(uid)
			}
			break
		}
	}
	return p, nil
}

// InNetNS runs fn on a thread moved into the network namespace at path.
// What fn opens there (a netlink socket, a BPF iterator) stays of that
// namespace after fn returns.
func InNetNS(path string, fn func() error) error {
	done := make(chan error, 1)
	// A goroutine of its own: should the thread fail to return to its
	// namespace, it stays locked, and Go ends it with the goroutine rather
	// than run anything else in the wrong namespace.
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("open own network namespace: %w", err)
			return
		}
		defer orig.Close()
		target, err := os.Open(path)
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("open network namespace %s: %w", path, err)
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("enter network namespace %s: %w", path, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- fmt.Errorf("return from network namespace %s: %w", path, err)
			return
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}
