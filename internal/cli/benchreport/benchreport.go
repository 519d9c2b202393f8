// SPDX-License-Identifier: Apache-2.0

// Package benchreport is what the bench subcommands share: checking the
// report's destination before a long run, and writing the report as
// Markdown or JSON to a file or standard output.
package benchreport

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/magnet-tracer/magnet/internal/outfile"
)

// Report is a benchmark's result that can be written both ways.
type Report interface {
	WriteJSON(w io.Writer) error
	WriteMarkdown(w io.Writer) error
}

// CheckOutput fails when path's directory cannot take the report, so that
// a long run does not end in a write error.
func CheckOutput(path string) error {
	dir := filepath.Dir(path)
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	return syscall.Access(dir, 2 /* W_OK */)
}

// Write renders rep whole first, so a failed rendering leaves no half
// file, then writes it to path, or to stdout when path is empty.
func Write(stdout io.Writer, path string, asJSON bool, rep Report) error {
	var buf bytes.Buffer
	var err error
	if asJSON {
		err = rep.WriteJSON(&buf)
	} else {
		err = rep.WriteMarkdown(&buf)
	}
	if err != nil {
		return err
	}
	if path == "" {
		_, err = stdout.Write(buf.Bytes())
	} else {
		// Through outfile, as every output: bench runs as root, and must not
		// follow a link another user planted in /tmp.
		err = outfile.WriteFile(path, buf.Bytes())
	}
	if err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

// Run is a bench subcommand's whole life: check -o before the long run,
// run until done or interrupted (SIGINT, SIGTERM), write the report.
// Errors carry name ("bench", "bench probe") in front.
func Run[R Report](ctx context.Context, name string, stdout io.Writer, path string, asJSON bool, run func(context.Context) (R, error)) error {
	if path != "" {
		if err := CheckOutput(path); err != nil {
			return fmt.Errorf("%s: -o: %w", name, err)
		}
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if err := Write(stdout, path, asJSON, rep); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}
