// SPDX-License-Identifier: Apache-2.0

// Package tracerproc runs a tracing tool (tcpdump, perf, bpftrace, magnet
// record) as a child process the way a user does: start it, wait until it
// says it is ready, end it with SIGINT and keep what it said on stderr.
// Benchmarks compare magnet with these tools; they all start and stop alike.
package tracerproc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proc is a tracer process whose stderr is kept for its closing words.
type Proc struct {
	Name   string
	Output string // the file it writes, "" for none
	Cmd    *exec.Cmd
	mu     sync.Mutex
	stderr bytes.Buffer
	closed chan struct{} // stderr reached EOF
}

// Start starts cmd and waits until it is ready: a line of its stderr
// contains mark, or the file readyPath exists (a tool that cannot print
// when it is ready creates a file; there is nothing else to wait on; the
// file is removed once seen). A tool not ready within timeout is ended.
func Start(name string, cmd *exec.Cmd, output, mark, readyPath string, timeout time.Duration) (*Proc, error) {
	p := &Proc{Name: name, Cmd: cmd, Output: output, closed: make(chan struct{})}
	pipe, err := cmd.StderrPipe()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	ready := make(chan struct{})
	go p.readStderr(pipe, mark, ready)
	deadline := time.After(timeout)
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case <-ready:
			return p, nil
		case <-p.closed:
			_ = cmd.Wait()
			removeOutput(output)
			return nil, fmt.Errorf("%s exited before it was ready: %s", name, OneLine(p.Stderr()))
		case <-deadline:
			_ = p.End(time.Minute)
			removeOutput(output)
			return nil, fmt.Errorf("%s not ready after %s: %s", name, timeout, OneLine(p.Stderr()))
		case <-poll.C:
			if readyPath != "" {
				if _, err := os.Stat(readyPath); err == nil {
					os.Remove(readyPath)
					return p, nil
				}
			}
		}
	}
}

func removeOutput(path string) {
	if path != "" {
		os.Remove(path)
	}
}

// Pid is the tracer's process id.
func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

// Stderr is what the tracer has written on stderr so far.
func (p *Proc) Stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

func (p *Proc) readStderr(r io.Reader, mark string, ready chan<- struct{}) {
	defer close(p.closed)
	sc := bufio.NewScanner(r)
	sent := false
	for sc.Scan() {
		p.mu.Lock()
		p.stderr.WriteString(sc.Text() + "\n")
		p.mu.Unlock()
		if !sent && mark != "" && strings.Contains(sc.Text(), mark) {
			close(ready)
			sent = true
		}
	}
}

// End stops the process with SIGINT, after which each of these tools
// writes out what it holds, killing it if it takes longer than grace.
func (p *Proc) End(grace time.Duration) error {
	_ = p.Cmd.Process.Signal(syscall.SIGINT)
	timer := time.AfterFunc(grace, func() { _ = p.Cmd.Process.Kill() })
	defer timer.Stop()
	<-p.closed
	err := p.Cmd.Wait()
	var ee *exec.ExitError
	// Ended by our SIGINT is a normal end (tcpdump, perf: 0; bpftrace: 0
	// or 130; a shell-style 128+SIGINT).
	if err != nil && (!errors.As(err, &ee) || ee.ExitCode() > 1 && ee.ExitCode() != 130) {
		return fmt.Errorf("%s: %s", p.Name, OneLine(p.Stderr()+" "+err.Error()))
	}
	return nil
}

// Size is the output file's size, 0 if there is none.
func (p *Proc) Size() int64 {
	fi, err := os.Stat(p.Output)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// FirstNumber is the first submatch of re in s as a number, 0 if none.
func FirstNumber(re *regexp.Regexp, s string) uint64 {
	m := re.FindStringSubmatch(s)
	if m == nil {
		return 0
	}
	n, _ := strconv.ParseUint(m[1], 10, 64)
	return n
}

// OneLine joins a tool's message into one line for an error.
func OneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

var reBpftraceLost = regexp.MustCompile(`Lost (\d+) events`)

// BpftraceCount counts the events in a bpftrace output file whose probes
// print one line per event, each starting with a number, and the events
// bpftrace says it lost, in the file or on its stderr.
func BpftraceCount(path, stderr string) (events, lost uint64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, fmt.Errorf("bpftrace output: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case len(line) > 0 && line[0] >= '0' && line[0] <= '9':
			events++
		case bytes.HasPrefix(line, []byte("Lost ")):
			lost += FirstNumber(reBpftraceLost, string(line))
		}
	}
	lost += FirstNumber(reBpftraceLost, stderr)
	if err := sc.Err(); err != nil {
		return events, lost, fmt.Errorf("bpftrace output: %w", err)
	}
	return events, lost, nil
}
