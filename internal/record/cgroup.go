// SPDX-License-Identifier: Apache-2.0

package record

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/probe"
)

// commandCgroup is a cgroup2 made for `record -- CMD`: the command starts in
// it (clone3 CLONE_INTO_CGROUP), its children and their sockets inherit it,
// and the BPF filter selects it by id.
type commandCgroup struct {
	path string
	fd   *os.File
	id   uint64
}

func newCommandCgroup() (*commandCgroup, error) {
	root, err := probe.Cgroup2Root()
	if err != nil {
		return nil, fmt.Errorf("record a command: %w", err)
	}
	path := filepath.Join(root, fmt.Sprintf("magnet-record-%d", os.Getpid()))
	if err := os.Mkdir(path, 0o755); err != nil && !os.IsExist(err) {
		return nil, fmt.Errorf("record a command: create cgroup: %w", err)
	}
	fd, err := os.Open(path)
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("record a command: open cgroup: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(fd.Fd()), &st); err != nil {
		fd.Close()
		os.Remove(path)
		return nil, fmt.Errorf("record a command: %w", err)
	}
	return &commandCgroup{path: path, fd: fd, id: st.Ino}, nil
}

func (c *commandCgroup) start(argv []string) (*exec.Cmd, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(c.fd.Fd())}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", argv[0], err)
	}
	return cmd, nil
}

// remove deletes the cgroup once the command's processes are gone; a child
// that outlived the command is killed first, so that nothing is left behind.
func (c *commandCgroup) remove() {
	c.fd.Close()
	for i := 0; i < 50; i++ {
		if err := os.Remove(c.path); err == nil || os.IsNotExist(err) {
			return
		}
		_ = os.WriteFile(filepath.Join(c.path, "cgroup.kill"), []byte("1"), 0)
		time.Sleep(20 * time.Millisecond)
	}
}
