// SPDX-License-Identifier: Apache-2.0

// Package outfile opens the files magnet writes (traces, exports, charts,
// ready files) so that writing one never destroys something else: a file the
// same command reads.
//
// What happens to an existing file at the path (docs/FORMAT.md, "What each
// command does with existing files"):
//   - it is the same file as one of the inputs (same device and inode, by
//     any name or link): refused, nothing is written;
//   - otherwise it is replaced: truncated once all of the above passed.
package outfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// Sentinel errors, for errors.Is.
var (
	// ErrIsInput means the output is a file the command reads.
	ErrIsInput = errors.New("output is an input")
)

// Options says what Create must protect.
type Options struct {
	// Inputs are the files the command reads: the output may be none of
	// them. Paths that do not exist are ignored.
	Inputs []string
	// Perm is the mode of a file Create makes; 0 means 0o644.
	Perm fs.FileMode
}

// Create opens path for writing, empty, as the package comment says. The
// caller must close the file (which releases the lock).
func Create(path string, opts Options) (*os.File, error) {
	if opts.Perm == 0 {
		opts.Perm = 0o644
	}
	f, err := open(path, opts.Perm)
	if err != nil {
		return nil, err
	}
	if err := check(f, path, opts); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
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

// open opens path for writing without truncating it: the checks come
// first.
func open(path string, perm fs.FileMode) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, perm)
	if err != nil {
		return nil, fmt.Errorf("create output: %w", err)
	}
	return f, nil
}

// check refuses an output that is an input, then empties it.
func check(f *os.File, path string, opts Options) error {
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
	if err := f.Truncate(0); err != nil {
		return fmt.Errorf("truncate output: %w", err)
	}
	return nil
}
