// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/netlab"
)

// pinning puts each of the two "hosts" on a CPU of its own (Options.Pin):
// the sender's processes and its side's tracer on one, the receiver's on the
// other, as on the papers' two machines. Unpinned, the two workload
// processes and their softirq work share the CPUs however the scheduler
// places them, and the baseline comes out in two modes (25-27 against
// 20-23 Gbit/s on the 2-vCPU CI VM) that no tracer can be judged against.
type pinning struct {
	sender, receiver int
	all              unix.CPUSet // this process's CPUs before any pinning
}

func newPinning() (*pinning, error) {
	p := &pinning{}
	if err := unix.SchedGetaffinity(0, &p.all); err != nil {
		return nil, fmt.Errorf("pin: CPU affinity: %w", err)
	}
	var cpus []int
	for i := 0; i < 1024 && len(cpus) < 2; i++ {
		if p.all.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	if len(cpus) < 2 {
		return nil, errors.New("pin: needs two CPUs, one per host")
	}
	p.sender, p.receiver = cpus[0], cpus[1]
	return p, nil
}

// cpuOf is the CPU of host h of lab.
func (p *pinning) cpuOf(lab *netlab.Lab, h netlab.Host) int {
	if h.NS == lab.Server.NS {
		return p.receiver
	}
	return p.sender
}

// onCPU is name and args, run on host h's CPU when pinning (taskset).
func (b *bencher) onCPU(lab *netlab.Lab, h netlab.Host, name string, args ...string) (string, []string) {
	if b.pin == nil {
		return name, args
	}
	return "taskset", append([]string{"-c", strconv.Itoa(b.pin.cpuOf(lab, h)), name}, args...)
}

// labCommand is lab.Command(h, name, args...), on h's CPU when pinning.
func (b *bencher) labCommand(lab *netlab.Lab, h netlab.Host, name string, args ...string) *exec.Cmd {
	name, args = b.onCPU(lab, h, name, args...)
	return lab.Command(h, name, args...)
}

// pinnedTracer is a tracer run in this process, on one CPU.
type pinnedTracer struct {
	tracer
	pin *pinning
}

func (t pinnedTracer) stop() (Traced, error) {
	tr, err := t.tracer.stop()
	if uerr := t.pin.unpinSelf(); err == nil && uerr != nil {
		err = uerr
	}
	return tr, err
}

// startPinned starts an in-process tracer with this process on host h's CPU.
func (b *bencher) startPinned(lab *netlab.Lab, h netlab.Host, start func() (tracer, error)) (tracer, error) {
	if b.pin == nil {
		return start()
	}
	if err := b.pin.pinSelf(b.pin.cpuOf(lab, h)); err != nil {
		return nil, err
	}
	t, err := start()
	if err != nil {
		_ = b.pin.unpinSelf()
		return nil, err
	}
	return pinnedTracer{t, b.pin}, nil
}

// pinSelf puts every thread of this process (and so the threads it makes
// later) on cpu, for the recorder the bench runs in-process; unpinSelf
// gives them all CPUs back.
func (p *pinning) pinSelf(cpu int) error {
	var one unix.CPUSet
	one.Set(cpu)
	return setAllThreads(&one)
}

func (p *pinning) unpinSelf() error {
	return setAllThreads(&p.all)
}

func setAllThreads(set *unix.CPUSet) error {
	tids, err := filepath.Glob("/proc/self/task/*")
	if err != nil {
		return err
	}
	for _, t := range tids {
		tid, err := strconv.Atoi(filepath.Base(t))
		if err != nil {
			continue
		}
		// A thread that exited meanwhile is no error.
		if err := unix.SchedSetaffinity(tid, set); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("pin: thread %d: %w", tid, err)
		}
	}
	return nil
}
