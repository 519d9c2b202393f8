// SPDX-License-Identifier: Apache-2.0

// Package netlab builds small networks out of Linux network namespaces
// for tests, benchmarks and demos: a Lab is a client and a server namespace
// joined by a veth pair, optionally rate-limited with a tc token bucket
// filter; a Path is a sender, a router and a receiver (and optionally a
// cross-traffic host at the router), with the bottleneck on the router's
// egress toward the receiver.
//
// Everything here needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and the ip(8)
// and tc(8) commands from iproute2. Call Available to find out whether a lab
// can be built, and always Close a Lab or Path once done with it.
package netlab

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// netnsDir is where ip-netns(8) keeps its named namespaces.
const netnsDir = "/run/netns"

// DefaultName is the namespace name prefix used when Options.Name is empty.
const DefaultName = "magnet"

// Interface names inside the two namespaces. Each name lives in its own
// namespace, so they never collide with other labs or with the host.
const (
	clientIface = "veth0"
	serverIface = "veth1"
)

// subnetBase is the /16 every lab takes its /30 from.
var subnetBase = netip.MustParseAddr("10.200.0.0")

// labCounter numbers the labs made by this process.
var labCounter atomic.Uint32

// Options configures New.
type Options struct {
	// Name is the prefix of the namespace names; DefaultName if empty.
	// A suffix made of the process id, a counter and random hex digits is
	// always added, so parallel runs never collide. It may use letters,
	// digits, '-', '_' and '.'.
	Name string
	// RateMbit limits both directions to this many megabits per second with
	// a tc tbf qdisc on the egress of both veth ends; 0 means unlimited.
	RateMbit int
}

// Host is one end of a Lab.
type Host struct {
	// NS is the namespace's name under /run/netns.
	NS string
	// Addr is the host's address on the veth link.
	Addr netip.Addr
	// Addr6 is its IPv6 address there, when the lab gave it one
	// (PathOptions.IPv6); the zero Addr otherwise.
	Addr6 netip.Addr
	// Iface is the name of the host's veth interface.
	Iface string
	// IfIndex is the interface index of Iface inside NS.
	IfIndex int
	// NetNSInode is the inode number of the namespace, which BPF programs
	// see as net->ns.inum.
	NetNSInode uint32
}

// Lab is a client and a server namespace joined by a veth pair.
// Create one with New and release it with Close.
type Lab struct {
	// Client and Server are the two hosts; their addresses are the first
	// and second host address of Subnet.
	Client, Server Host
	// Subnet is the /30 on the veth link, taken from 10.200.0.0/16.
	Subnet netip.Prefix
	// RateMbit is the rate limit applied, 0 when unlimited.
	RateMbit int

	mu      sync.Mutex
	created []string // namespaces made by New and not yet deleted
}

// Available reports whether this process can build a Lab: nil if so, else
// an error saying what is missing. Tests use it as the reason to skip.
func Available() error {
	if os.Geteuid() != 0 {
		return errors.New("netlab: need root to create network namespaces")
	}
	for _, tool := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("netlab: %s from iproute2 not found in PATH", tool)
		}
	}
	dir := netnsDir
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		dir = filepath.Dir(netnsDir) // ip creates /run/netns on first use
	}
	if err := syscall.Access(dir, 2 /* W_OK */); err != nil {
		return fmt.Errorf("netlab: %s is not writable: %w", dir, err)
	}
	if _, err := os.Stat("/proc/thread-self/ns/net"); err != nil {
		return fmt.Errorf("netlab: kernel without network namespaces: %w", err)
	}
	return nil
}

// New creates a lab: two named network namespaces, a veth pair between
// them, addresses from a /30 chosen for this lab in 10.200.0.0/16, loopback
// and veth interfaces up and, if opts.RateMbit is set, a tbf qdisc on both
// veth ends. Nothing else in the namespaces is changed. On failure New
// removes whatever it made. The caller must Close the returned Lab.
func New(opts Options) (*Lab, error) {
	prefix := opts.Name
	if prefix == "" {
		prefix = DefaultName
	}
	if !validName(prefix) {
		return nil, fmt.Errorf("netlab: invalid name %q (use letters, digits, '-', '_', '.')", prefix)
	}
	if opts.RateMbit < 0 {
		return nil, fmt.Errorf("netlab: negative rate %d Mbit/s", opts.RateMbit)
	}

	n := labCounter.Add(1)
	var rnd [2]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, fmt.Errorf("netlab: random name suffix: %w", err)
	}
	base := fmt.Sprintf("%s-%d-%d-%s", prefix, os.Getpid(), n, hex.EncodeToString(rnd[:]))

	subnet := pickSubnet(uint32(os.Getpid()), n)
	clientAddr := subnet.Addr().Next()
	serverAddr := clientAddr.Next()

	l := &Lab{
		Client:   Host{NS: base + "-c", Addr: clientAddr, Iface: clientIface},
		Server:   Host{NS: base + "-s", Addr: serverAddr, Iface: serverIface},
		Subnet:   subnet,
		RateMbit: opts.RateMbit,
	}
	if err := l.setup(); err != nil {
		if cerr := l.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
		return nil, fmt.Errorf("netlab: %w", err)
	}
	return l, nil
}

// pickSubnet returns the /30 for lab number n of process pid. Labs of one
// process always differ; labs of different processes usually do, and share
// no link even when they do not.
func pickSubnet(pid, n uint32) netip.Prefix {
	const slots = 1 << 14 // /30s in a /16
	idx := (pid*64 + n) % slots
	b := subnetBase.As4()
	b[2] = byte(idx >> 6)
	b[3] = byte(idx&63) * 4
	return netip.PrefixFrom(netip.AddrFrom4(b), 30)
}

func (l *Lab) setup() error {
	for _, h := range []*Host{&l.Client, &l.Server} {
		if err := ip("netns", "add", h.NS); err != nil {
			return err
		}
		l.mu.Lock()
		l.created = append(l.created, h.NS)
		l.mu.Unlock()
	}
	// Creating the pair inside the client namespace and sending the peer
	// straight to the server namespace keeps the host's namespace untouched.
	if err := ip("-n", l.Client.NS, "link", "add", clientIface, "type", "veth",
		"peer", "name", serverIface, "netns", l.Server.NS); err != nil {
		return err
	}
	bits := strconv.Itoa(l.Subnet.Bits())
	for _, h := range []*Host{&l.Client, &l.Server} {
		if err := ip("-n", h.NS, "addr", "add", h.Addr.String()+"/"+bits, "dev", h.Iface); err != nil {
			return err
		}
		if err := ip("-n", h.NS, "link", "set", "lo", "up"); err != nil {
			return err
		}
		if err := ip("-n", h.NS, "link", "set", h.Iface, "up"); err != nil {
			return err
		}
		if l.RateMbit > 0 {
			if err := addTBF(h.NS, h.Iface, l.RateMbit); err != nil {
				return err
			}
		}
		if err := h.fill(); err != nil {
			return err
		}
	}
	return nil
}

// addTBF limits egress of dev in namespace ns to rate Mbit/s.
func addTBF(ns, dev string, rateMbit int) error {
	return run("tc", tbfArgs(ns, dev, rateMbit)...)
}

// tbfArgs returns the tc arguments for a token bucket filter at rateMbit.
//
// The bucket holds 4 ms worth of tokens but never less than 64 KiB, so tbf
// passes GSO packets (up to 64 KiB on veth) on whole instead of segmenting
// them itself, a step a real NIC with TSO would not add to a trace. The
// queue holds 50 ms of traffic. At 100 Mbit/s one TCP flow gets about
// 96 Mbit/s of goodput.
func tbfArgs(ns, dev string, rateMbit int) []string {
	burst := rateMbit * 1000 * 1000 / 8 * 4 / 1000 // bytes in 4 ms
	burst = max(burst, 64*1024)
	return []string{"-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf",
		"rate", strconv.Itoa(rateMbit) + "mbit",
		"burst", strconv.Itoa(burst),
		"latency", "50ms"}
}

// fill looks up the interface index and namespace inode of h.
func (h *Host) fill() error {
	var st syscall.Stat_t
	p := filepath.Join(netnsDir, h.NS)
	if err := syscall.Stat(p, &st); err != nil {
		return fmt.Errorf("stat %s: %w", p, err)
	}
	h.NetNSInode = uint32(st.Ino)
	return h.Do(func() error {
		ifi, err := net.InterfaceByName(h.Iface)
		if err != nil {
			return fmt.Errorf("look up %s in %s: %w", h.Iface, h.NS, err)
		}
		h.IfIndex = ifi.Index
		return nil
	})
}

// Close deletes both namespaces, which takes the veth pair with them.
// It is safe to call more than once and after a failed setup.
func (l *Lab) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var errs []error
	var left []string
	for _, ns := range l.created {
		if err := deleteNS(ns); err != nil {
			errs = append(errs, err)
			left = append(left, ns)
		}
	}
	l.created = left
	return errors.Join(errs...)
}

// deleteNS removes the named namespace; a namespace already gone is fine.
func deleteNS(ns string) error {
	if _, err := os.Lstat(filepath.Join(netnsDir, ns)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return ip("netns", "delete", ns)
}

// Command returns a command that runs name with args inside h's network
// namespace, through ip netns exec.
func (l *Lab) Command(h Host, name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", h.NS, name}, args...)...)
}

// Do runs fn on the current goroutine, locked to its OS thread and with that
// thread switched into h's network namespace; the thread's namespace is
// restored afterwards. Sockets created inside fn belong to h's namespace and
// stay there when used later from any goroutine. Goroutines started by fn do
// not run in h's namespace.
//
// If the original namespace cannot be restored, Do returns an error and
// leaves the goroutine locked to the thread, so that Go discards the thread
// when the goroutine exits instead of reusing it.
func (h Host) Do(fn func() error) (err error) {
	target, err := os.Open(filepath.Join(netnsDir, h.NS))
	if err != nil {
		return fmt.Errorf("open netns: %w", err)
	}
	defer target.Close()

	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open current netns: %w", err)
	}
	defer orig.Close()
	if err := setns(target); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter netns %s: %w", h.NS, err)
	}
	defer func() {
		if rerr := setns(orig); rerr != nil {
			err = errors.Join(err, fmt.Errorf("restore netns after %s: %w", h.NS, rerr))
			return // stay locked: the thread dies with the goroutine
		}
		runtime.UnlockOSThread()
	}()
	return fn()
}

// setns moves the calling thread into the network namespace f refers to.
func setns(f *os.File) error {
	return unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
}

// CleanupStale deletes namespaces left behind by crashed runs: those whose
// names New made from prefix (DefaultName if empty) and whose creating
// process no longer exists. Labs of running processes, including this one,
// are left alone. Errors are ignored; the cleanup is best effort.
func CleanupStale(prefix string) {
	if prefix == "" {
		prefix = DefaultName
	}
	entries, err := os.ReadDir(netnsDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		pid, ok := creatorPID(prefix, e.Name())
		if !ok || pid == os.Getpid() || processAlive(pid) {
			continue
		}
		_ = deleteNS(e.Name())
	}
}

// creatorPID parses a name made by New from prefix and returns the pid in it.
func creatorPID(prefix, name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, prefix+"-")
	if !ok {
		return 0, false
	}
	parts := strings.Split(rest, "-") // pid, counter, random, role (of a Lab or a Path)
	if len(parts) != 4 || (parts[3] != "c" && parts[3] != "s" && !isPathRole(parts[3])) {
		return 0, false
	}
	pid, err := strconv.Atoi(parts[0])
	if err != nil || pid <= 0 {
		return 0, false
	}
	if _, err := strconv.ParseUint(parts[1], 10, 32); err != nil {
		return 0, false
	}
	if _, err := hex.DecodeString(parts[2]); err != nil || len(parts[2]) != 4 {
		return 0, false
	}
	return pid, true
}

// processAlive reports whether a process with this pid exists.
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func validName(s string) bool {
	if s == "" || len(s) > 200 {
		return false
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9',
			r == '-', r == '_', r == '.':
		default:
			return false
		}
	}
	return s[0] != '.' && s[0] != '-'
}

func ip(args ...string) error { return run("ip", args...) }

// run runs an iproute2 command and turns a failure into one line with the
// command and its complaint.
func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		msg := string(bytes.TrimSpace(out))
		if msg == "" {
			msg = err.Error()
		}
		msg = strings.ReplaceAll(msg, "\n", "; ")
		return fmt.Errorf("%s %s: %s", name, strings.Join(args, " "), msg)
	}
	return nil
}
