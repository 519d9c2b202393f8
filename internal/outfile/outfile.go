// SPDX-License-Identifier: Apache-2.0

// Package outfile opens the files magnet writes (traces, exports, charts,
// ready files) so that writing one never destroys something else: a file the
// same command reads, a trace another recorder is writing, or, for a
// privileged magnet, whatever a symbolic link another user planted in /tmp
// points at.
//
// What happens to an existing file at the path (docs/FORMAT.md, "What each
// command does with existing files"):
//   - it is the same file as one of the inputs (same device and inode, by
//     any name or link): refused, nothing is written;
//   - another process holds the lock Create takes: refused;
//   - in a sticky world-writable directory (/tmp, /var/tmp): a symbolic link
//     is never followed, and a file owned by another user or with more than
//     one hard link is refused, as the kernel's fs.protected_symlinks and
//     fs.protected_regular would (they are off on some systems);
//   - otherwise it is replaced: truncated once all of the above passed.
package outfile

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Sentinel errors, for errors.Is.
var (
	// ErrIsInput means the output is a file the command reads.
	ErrIsInput = errors.New("output is an input")
	// ErrLocked means another process is writing the output.
	ErrLocked = errors.New("output is being written by another process")
	// ErrUnsafe means the output lies in a sticky world-writable directory
	// and is a symbolic link or a file that is not the caller's own.
	ErrUnsafe = errors.New("unsafe output in a shared directory")
)

// Options says what Create must protect.
type Options struct {
	// Inputs are the files the command reads: the output may be none of
	// them. Paths that do not exist are ignored.
	Inputs []string
	// Lock takes an exclusive flock on the output for as long as the file
	// stays open, and refuses the output when another process holds one:
	// two recorders on one file would interleave their blocks.
	Lock bool
	// Perm is the mode of a file Create makes; 0 means 0o644.
	Perm fs.FileMode
}

// Create opens path for writing, empty, as the package comment says. The
// caller must close the file (which releases the lock).
func Create(path string, opts Options) (*os.File, error) {
	if opts.Perm == 0 {
		opts.Perm = 0o644
	}
	f, err := openFile(path, opts.Perm, true)
	if err != nil {
		return nil, err
	}
	if err := check(f, path, opts, true); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// Check runs Create's checks on path without creating or emptying it, and
// without keeping a lock: a command with two outputs checks the second
// before it writes the first, so that a refusal leaves both as they were.
// A path that does not exist passes unless it names one of opts.Inputs
// (an output the command is about to write).
func Check(path string, opts Options) error {
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		abs, _ := filepath.Abs(path)
		for _, in := range opts.Inputs {
			if a, _ := filepath.Abs(in); a == abs {
				return fmt.Errorf("%s is also the output %s: %w: refusing to write both to one file (choose another output)", path, in, ErrIsInput)
			}
		}
		return nil
	}
	f, err := openFile(path, 0, false)
	if err != nil {
		return err
	}
	defer f.Close() // releases the lock check took
	return check(f, path, opts, false)
}

// WriteFile writes data to path through Create: a small file such as a
// ready file, in which a planted symbolic link must not make a privileged
// magnet write elsewhere.
func WriteFile(path string, data []byte) error {
	f, err := Create(path, Options{})
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}

// Shared reports whether dir is a sticky world-writable directory, where
// other users may create names the caller did not choose.
func Shared(dir string) bool {
	fi, err := os.Stat(dir)
	if err != nil {
		return false
	}
	m := fi.Mode()
	return m.IsDir() && m&fs.ModeSticky != 0 && m.Perm()&0o002 != 0
}

// openFile opens path for writing without truncating it (the checks come
// first), following a symbolic link only outside a shared directory; it
// creates the file when create is set, else opens only an existing one.
func openFile(path string, perm fs.FileMode, create bool) (*os.File, error) {
	dir := filepath.Dir(path)
	if !Shared(dir) {
		flags := os.O_WRONLY
		if create {
			flags |= os.O_CREATE
		}
		f, err := os.OpenFile(path, flags, perm)
		if err != nil {
			return nil, fmt.Errorf("create output: %w", err)
		}
		return f, nil
	}
	if create {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, perm)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("create output: %w", err)
		}
	}
	f, err := os.OpenFile(path, os.O_WRONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if errors.Is(err, unix.ELOOP) {
		return nil, fmt.Errorf("%s is a symbolic link in %s, a sticky world-writable directory: %w: not following it (remove it or write elsewhere)", path, dir, ErrUnsafe)
	}
	if err != nil {
		return nil, fmt.Errorf("create output: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("stat output: %w", err)
	}
	switch euid := os.Geteuid(); {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		f.Close()
		return nil, fmt.Errorf("%s in %s, a sticky world-writable directory, is not a regular file: %w: not writing to it", path, dir, ErrUnsafe)
	case int(st.Uid) != euid:
		f.Close()
		return nil, fmt.Errorf("%s in %s, a sticky world-writable directory, belongs to uid %d, not to this user (uid %d): %w: not replacing it (remove it or write elsewhere)", path, dir, st.Uid, euid, ErrUnsafe)
	case st.Nlink != 1:
		f.Close()
		return nil, fmt.Errorf("%s in %s, a sticky world-writable directory, has %d hard links: %w: not replacing it (remove it or write elsewhere)", path, dir, st.Nlink, ErrUnsafe)
	}
	return f, nil
}

// check refuses an output that is an input or locked by another process,
// then, when truncate is set, empties it.
func check(f *os.File, path string, opts Options, truncate bool) error {
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat output: %w", err)
	}
	for _, in := range opts.Inputs {
		if ii, err := os.Stat(in); err == nil && os.SameFile(fi, ii) {
			if in == path {
				return fmt.Errorf("%s: %w: refusing to overwrite what it reads (choose another output)", path, ErrIsInput)
			}
			return fmt.Errorf("%s is the same file as the input %s: %w: refusing to overwrite what it reads (choose another output)", path, in, ErrIsInput)
		}
	}
	if !fi.Mode().IsRegular() {
		// A device or pipe (-o /dev/null): nothing to lock or truncate.
		return nil
	}
	if opts.Lock || !truncate {
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			if errors.Is(err, unix.EWOULDBLOCK) {
				by := ""
				if pid := lockHolder(fi); pid > 0 {
					by = fmt.Sprintf(" (pid %d%s)", pid, command(pid))
				}
				return fmt.Errorf("%s%s: %w: refusing to write it too", path, by, ErrLocked)
			}
			return fmt.Errorf("lock output: %w", err)
		}
	}
	if !truncate {
		return nil
	}
	if err := f.Truncate(0); err != nil {
		return fmt.Errorf("truncate output: %w", err)
	}
	return nil
}

// lockHolder finds the process holding a flock on the file, from
// /proc/locks; 0 when it cannot tell.
func lockHolder(fi fs.FileInfo) int {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0
	}
	lf, err := os.Open("/proc/locks")
	if err != nil {
		return 0
	}
	defer lf.Close()
	// "1: FLOCK  ADVISORY  WRITE 25615 fe:00:10003006 0 EOF"
	want := fmt.Sprintf("%02x:%02x:%d", unix.Major(uint64(st.Dev)), unix.Minor(uint64(st.Dev)), st.Ino)
	sc := bufio.NewScanner(lf)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 6 && f[1] == "FLOCK" && f[5] == want {
			pid, _ := strconv.Atoi(f[4])
			return pid
		}
	}
	return 0
}

// command names process pid for a message: ", magnet".
func command(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil {
		return ""
	}
	return ", " + strings.TrimSpace(string(b))
}
