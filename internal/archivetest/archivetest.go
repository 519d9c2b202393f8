// SPDX-License-Identifier: Apache-2.0

// Package archivetest starts real archive servers for tests, on loopback:
// an OpenSSH server (sshd) and an S3-compatible object store (moto_server).
// Both are installed by scripts/deps.sh; a test that lacks one is skipped
// with the reason. Every server is ended by the test's cleanup.
package archivetest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// SSHD is an OpenSSH server on 127.0.0.1 that lets this user in with a key
// made for the test.
type SSHD struct {
	Port       int
	Identity   string // private key file
	KnownHosts string // known_hosts naming the server's key
	User       string
	dir        string
	cmd        *exec.Cmd
	t          testing.TB
}

// StartSSHD starts sshd -D on a free high port. It needs root (sshd's
// privilege separation) and the openssh-server package.
func StartSSHD(t testing.TB) *SSHD {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the test sshd needs root")
	}
	sshd, err := exec.LookPath("sshd")
	if err != nil {
		if _, err2 := os.Stat("/usr/sbin/sshd"); err2 != nil {
			t.Skip("sshd not installed (scripts/deps.sh installs openssh-server)")
		}
		sshd = "/usr/sbin/sshd"
	}
	for _, tool := range []string{"ssh", "ssh-keygen"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (scripts/deps.sh installs openssh-client)", tool)
		}
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o700)
	keygen := func(path string) {
		if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", path).CombinedOutput(); err != nil {
			t.Fatalf("ssh-keygen: %v %s", err, out)
		}
	}
	keygen(filepath.Join(dir, "host_key"))
	keygen(filepath.Join(dir, "id"))
	pub, err := os.ReadFile(filepath.Join(dir, "id.pub"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "authorized_keys"), pub, 0o600); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll("/run/sshd", 0o755) // privilege separation directory
	s := &SSHD{Port: FreePort(t), Identity: filepath.Join(dir, "id"), User: "root", dir: dir, t: t,
		KnownHosts: filepath.Join(dir, "known_hosts")}
	hostPub, err := os.ReadFile(filepath.Join(dir, "host_key.pub"))
	if err != nil {
		t.Fatal(err)
	}
	known := fmt.Sprintf("[127.0.0.1]:%d %s", s.Port, hostPub)
	if err := os.WriteFile(s.KnownHosts, []byte(known), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`Port %d
ListenAddress 127.0.0.1
HostKey %s/host_key
AuthorizedKeysFile %s/authorized_keys
PidFile %s/sshd.pid
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
MaxStartups 100
LogLevel ERROR
`, s.Port, dir, dir, dir)
	if err := os.WriteFile(filepath.Join(dir, "sshd_config"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	s.cmd = exec.Command(sshd, "-D", "-e", "-f", filepath.Join(dir, "sshd_config"))
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

// Start starts (or restarts) the server and waits until it accepts.
func (s *SSHD) Start() {
	s.t.Helper()
	if s.cmd.Process != nil && s.cmd.ProcessState == nil {
		return
	}
	s.cmd = exec.Command(s.cmd.Path, s.cmd.Args[1:]...)
	s.cmd.Stderr = os.Stderr
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its session children go with it
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start sshd: %v", err)
	}
	waitListening(s.t, s.Port, s.cmd)
}

// Stop ends the server and every session it started (they run in sessions
// of their own, so they are found as its descendants): the archive becomes
// unreachable, connections refused and open ones cut.
func (s *SSHD) Stop() {
	if s.cmd == nil || s.cmd.Process == nil || s.cmd.ProcessState != nil {
		return
	}
	pids := descendants(s.cmd.Process.Pid)
	syscall.Kill(s.cmd.Process.Pid, syscall.SIGKILL)
	for _, p := range pids {
		syscall.Kill(p, syscall.SIGKILL)
	}
	s.cmd.Wait()
}

// descendants lists the processes below pid, from /proc.
func descendants(pid int) []int {
	parent := map[int]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so cut after ')'.
		i := strings.LastIndexByte(string(data), ')')
		f := strings.Fields(string(data[i+1:]))
		if len(f) > 1 {
			parent[p], _ = strconv.Atoi(f[1])
		}
	}
	var out []int
	frontier := []int{pid}
	for len(frontier) > 0 {
		var next []int
		for p, pp := range parent {
			for _, f := range frontier {
				if pp == f {
					out = append(out, p)
					next = append(next, p)
				}
			}
		}
		frontier = next
	}
	return out
}

// SSH runs a command on the server as a client, outside any collect
// service (the tests' own traffic to the archive).
// TargetYAML is a collect configuration's `targets:` block shipping to
// this server under path, as the collect tests write it.
func (s *SSHD) TargetYAML(path string) string {
	return fmt.Sprintf(`targets:
  - type: ssh
    host: 127.0.0.1
    port: %d
    user: %s
    path: %s
    identity_file: %s
    known_hosts: %s
`, s.Port, s.User, path, s.Identity, s.KnownHosts)
}

func (s *SSHD) SSH(args ...string) *exec.Cmd {
	a := []string{"-o", "BatchMode=yes", "-i", s.Identity, "-o", "IdentitiesOnly=yes", "-o", "UserKnownHostsFile=" + s.KnownHosts,
		"-o", "StrictHostKeyChecking=yes", "-p", strconv.Itoa(s.Port), s.User + "@127.0.0.1"}
	return exec.Command("ssh", append(a, args...)...)
}

// Moto is an S3-compatible object store (moto_server) on 127.0.0.1.
type Moto struct {
	Endpoint string // http://127.0.0.1:PORT
	Port     int
	cmd      *exec.Cmd
}

// Credentials moto accepts (any would do).
const (
	AccessKey = "magnet-test"
	SecretKey = "magnet-test-secret"
)

// StartMoto starts moto_server (pip install 'moto[server]').
func StartMoto(t testing.TB) *Moto {
	t.Helper()
	bin, err := exec.LookPath("moto_server")
	if err != nil {
		t.Skip("moto_server not installed (scripts/deps.sh installs moto[server])")
	}
	m := &Moto{Port: FreePort(t)}
	m.Endpoint = fmt.Sprintf("http://127.0.0.1:%d", m.Port)
	m.cmd = exec.Command(bin, "-H", "127.0.0.1", "-p", strconv.Itoa(m.Port))
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := m.cmd.Start(); err != nil {
		t.Fatalf("start moto_server: %v", err)
	}
	t.Cleanup(func() {
		syscall.Kill(-m.cmd.Process.Pid, syscall.SIGCONT)
		syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL)
		m.cmd.Wait()
	})
	waitListening(t, m.Port, m.cmd)
	return m
}

// Pause freezes the store (SIGSTOP): connections are accepted by the kernel
// but never answered, as with a store that hangs. Resume thaws it, with
// everything it held.
func (m *Moto) Pause()  { syscall.Kill(-m.cmd.Process.Pid, syscall.SIGSTOP) }
func (m *Moto) Resume() { syscall.Kill(-m.cmd.Process.Pid, syscall.SIGCONT) }

// FreePort returns a loopback TCP port nothing listens on now.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func waitListening(t testing.TB, port int, cmd *exec.Cmd) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			c.Close()
			return
		}
		if cmd.ProcessState != nil || time.Now().After(deadline) {
			t.Fatalf("%s does not listen on port %d: %v", strings.Join(cmd.Args, " "), port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
