// SPDX-License-Identifier: Apache-2.0

package probe

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/cilium/ebpf/link"
)

// The sockets that exist before the probes attach are learned by the
// iterators of bpf/layer/learn.c, which the recorder runs once, after
// Load, in each network namespace (an iterator sees the sockets of the
// namespace it is opened in).

// LearnPrograms are the iterators: programs of magnet's object that no
// hook attaches, run once at start.
var LearnPrograms = []string{"learn_tcp", "learn_udp"}

// Verdicts of struct mg_learned (bpf/layer/learn.c LEARN_*).
const (
	LearnKnown    = 1 // the hooks had met the socket already
	LearnSelected = 2 // learned and announced with conn_open
	LearnEligible = 3 // learned, not announced: the pid filter waits for its owner
	LearnOut      = 4 // the filters leave it out
	LearnNotConn  = 5 // not a connection
)

// learnedSize is sizeof(struct mg_learned).
const learnedSize = 24

// Learned is one socket an iterator visited.
type Learned struct {
	Cookie  uint64
	Inode   uint64
	NetNS   uint32
	Proto   uint8
	State   uint8
	Verdict uint8
	Owned   bool // its owner was given to SetSocketOwners
}

// SocketOwner is the task a learned socket's conn_open names.
type SocketOwner struct {
	PID  uint32
	UID  uint32
	Comm string
}

// ErrNoLearning says that this kernel did not load the iterators.
var ErrNoLearning = errors.New("socket iterators (iter/tcp, iter/udp) not loaded")

// SetSocketOwners gives the iterators the owner of each socket inode. The
// map holds at most its size; the sockets past it are learned without an
// owner (the recorder then looks a listener's or UDP socket's up alone).
func (p *Probe) SetSocketOwners(owners map[uint64]SocketOwner) error {
	m := p.coll.Maps["learn_owners"]
	if m == nil {
		return ErrNoLearning
	}
	keys := make([]uint64, 0, min(len(owners), int(m.MaxEntries())))
	vals := make([]magnetTaskId, 0, cap(keys))
	for ino, o := range owners {
		if len(keys) == cap(keys) {
			break
		}
		v := magnetTaskId{PidTgid: uint64(o.PID)<<32 | uint64(o.PID), Uid: o.UID}
		var comm [16]byte
		copy(comm[:15], o.Comm)
		v.Comm[0] = binary.NativeEndian.Uint64(comm[:8])
		v.Comm[1] = binary.NativeEndian.Uint64(comm[8:])
		keys = append(keys, ino)
		vals = append(vals, v)
	}
	if len(keys) == 0 {
		return nil
	}
	if _, err := m.BatchUpdate(keys, vals, nil); err != nil {
		return fmt.Errorf("fill socket owners: %w", err)
	}
	return nil
}

// SocketLearner runs the iterators; Close releases them.
type SocketLearner struct {
	links []*link.Iter
}

// SocketLearner attaches the iterators, or returns ErrNoLearning.
func (p *Probe) SocketLearner() (*SocketLearner, error) {
	var l SocketLearner
	for _, name := range LearnPrograms {
		prog := p.coll.Programs[name]
		if prog == nil {
			l.Close()
			return nil, ErrNoLearning
		}
		it, err := link.AttachIter(link.IterOptions{Program: prog})
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("attach %s: %w", name, err)
		}
		l.links = append(l.links, it)
	}
	return &l, nil
}

// Open opens the iterators in the calling thread's network namespace; each
// read of one runs it over the next sockets.
func (l *SocketLearner) Open() ([]io.ReadCloser, error) {
	var out []io.ReadCloser
	for _, it := range l.links {
		rc, err := it.Open()
		if err != nil {
			for _, o := range out {
				o.Close()
			}
			return nil, fmt.Errorf("open socket iterator: %w", err)
		}
		out = append(out, rc)
	}
	return out, nil
}

// Close detaches the iterators.
func (l *SocketLearner) Close() {
	for _, it := range l.links {
		it.Close()
	}
}

// ReadLearned reads an opened iterator to its end, calling each after
// every read with the sockets it learned (between reads, the caller can
// drain the control ring, which takes their conn_open records).
func ReadLearned(r io.Reader, each func([]Learned) error) error {
	buf := make([]byte, 4096/learnedSize*learnedSize)
	var pending []byte
	var got []Learned
	for {
		n, err := r.Read(buf)
		pending = append(pending, buf[:n]...)
		got = got[:0]
		for len(pending) >= learnedSize {
			got = append(got, parseLearned(pending[:learnedSize]))
			pending = pending[learnedSize:]
		}
		if len(got) > 0 {
			if e := each(got); e != nil {
				return e
			}
		}
		if errors.Is(err, io.EOF) || (n == 0 && err == nil) {
			if len(pending) != 0 {
				return fmt.Errorf("socket iterator: %d bytes of a partial record", len(pending))
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("read socket iterator: %w", err)
		}
	}
}

func parseLearned(b []byte) Learned {
	return Learned{
		Cookie:  binary.NativeEndian.Uint64(b[0:]),
		Inode:   binary.NativeEndian.Uint64(b[8:]),
		NetNS:   binary.NativeEndian.Uint32(b[16:]),
		Proto:   b[20],
		State:   b[21],
		Verdict: b[22],
		Owned:   b[23] != 0,
	}
}
