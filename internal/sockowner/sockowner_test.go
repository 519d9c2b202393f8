// SPDX-License-Identifier: Apache-2.0

package sockowner

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// fakeProc builds a /proc with the processes given: pid -> parent, name
// and the socket inodes its descriptors hold.
func fakeProc(t *testing.T, procs map[int]struct {
	ppid    int
	comm    string
	uid     int
	sockets []uint64
}) string {
	t.Helper()
	root := t.TempDir()
	for pid, p := range procs {
		dir := filepath.Join(root, strconv.Itoa(pid))
		if err := os.MkdirAll(filepath.Join(dir, "fd"), 0o755); err != nil {
			t.Fatal(err)
		}
		write := func(name, s string) {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		write("comm", p.comm+"\n")
		write("status", fmt.Sprintf("Name:\t%s\nUid:\t%d\t%d\t%d\t%d\n", p.comm, p.uid, p.uid+1, p.uid, p.uid))
		// A name with a space and a parenthesis, as comm may be.
		write("stat", fmt.Sprintf("%d (%s) x) S %d 1 1 0\n", pid, p.comm, p.ppid))
		links := []string{"/dev/null", "pipe:[77]", "anon_inode:[eventpoll]"}
		for _, ino := range p.sockets {
			links = append(links, fmt.Sprintf("socket:[%d]", ino))
		}
		for i, l := range links {
			if err := os.Symlink(l, filepath.Join(dir, "fd", strconv.Itoa(i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Not a process.
	if err := os.MkdirAll(filepath.Join(root, "net"), 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

// TestWalk: each socket's owner is the process holding it whose parent
// does not (a forking server's master, not its workers), else the lowest
// pid; the owner carries its name and real uid.
func TestWalk(t *testing.T) {
	type proc = struct {
		ppid    int
		comm    string
		uid     int
		sockets []uint64
	}
	root := fakeProc(t, map[int]proc{
		100: {ppid: 1, comm: "nginx", uid: 0, sockets: []uint64{10, 11}},
		101: {ppid: 100, comm: "nginx", uid: 33, sockets: []uint64{10, 12}},
		102: {ppid: 100, comm: "nginx", uid: 33, sockets: []uint64{10}},
		300: {ppid: 1, comm: "a b)", uid: 1000, sockets: []uint64{20}},
		301: {ppid: 1, comm: "other", uid: 1001, sockets: []uint64{20}},
	})
	tb, err := Walk(root)
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint64]Process{
		10: {PID: 100, UID: 0, Comm: "nginx"},
		11: {PID: 100, UID: 0, Comm: "nginx"},
		12: {PID: 101, UID: 33, Comm: "nginx"},
		20: {PID: 300, UID: 1000, Comm: "a b)"},
	}
	if len(tb.Owners) != len(want) {
		t.Errorf("owners %v, want %v", tb.Owners, want)
	}
	for ino, w := range want {
		if got := tb.Owners[ino]; got != w {
			t.Errorf("socket %d: owner %+v, want %+v", ino, got, w)
		}
	}
	if tb.Processes != 5 {
		t.Errorf("read %d processes, want 5", tb.Processes)
	}
}

func TestWalkNoProc(t *testing.T) {
	if _, err := Walk(filepath.Join(t.TempDir(), "absent")); err == nil {
		t.Error("no error for a missing /proc")
	}
}

func TestSocketInode(t *testing.T) {
	for _, c := range []struct {
		link string
		ino  uint64
		ok   bool
	}{
		{"socket:[41235]", 41235, true},
		{"socket:[0]", 0, false},
		{"socket:[]", 0, false},
		{"socket:[12", 0, false},
		{"pipe:[12]", 0, false},
		{"socket:[-1]", 0, false},
		{"/dev/null", 0, false},
	} {
		ino, ok := socketInode(c.link)
		if ino != c.ino || ok != c.ok {
			t.Errorf("%q: %d %v, want %d %v", c.link, ino, ok, c.ino, c.ok)
		}
	}
}

func FuzzSocketInode(f *testing.F) {
	f.Add("socket:[41235]")
	f.Add("socket:[18446744073709551616]")
	f.Fuzz(func(t *testing.T, link string) {
		ino, ok := socketInode(link)
		if !ok {
			return
		}
		// Leading zeros aside, the link is the inode as ls -l prints it.
		digits := strings.TrimLeft(link[len("socket:["):len(link)-1], "0")
		if ino == 0 || fmt.Sprintf("socket:[%d]", ino) != "socket:["+digits+"]" {
			t.Errorf("%q parsed as %d", link, ino)
		}
	})
}

// TestInNetNSMissing: a namespace path that cannot be opened is an error,
// and fn does not run.
func TestInNetNSMissing(t *testing.T) {
	ran := false
	err := InNetNS(filepath.Join(t.TempDir(), "absent"), func() error { ran = true; return nil })
	if err == nil || ran {
		t.Errorf("err %v, ran %v", err, ran)
	}
}

func TestOldest(t *testing.T) {
	parents := map[int]int{100: 1, 101: 100, 102: 100, 50: 7, 200: 100}
	parent := func(p int) int { return parents[p] }
	for _, c := range []struct {
		pids []int
		want int
	}{
		{[]int{102, 101, 100}, 100}, // a master and its workers
		{[]int{101, 102}, 101},      // workers alone: the lowest
		{[]int{200, 50}, 50},        // unrelated: the lowest
		{[]int{42}, 42},
	} {
		if got := Oldest(c.pids, parent); got != c.want {
			t.Errorf("Oldest(%v) = %d, want %d", c.pids, got, c.want)
		}
	}
}
