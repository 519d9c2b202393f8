// SPDX-License-Identifier: Apache-2.0

package overhead

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/tracerproc"
)

// Workloads the measurement can drive.
const (
	Iperf3      = "iperf3"
	MagnetFlood = "magnet"
	dataPort    = 5201
)

// transfer is what one run of the workload moved.
type transfer struct {
	Sent, Received uint64  // bytes, as the sender and the receiver counted them
	Seconds        float64 // the receiver's time (iperf3) or the sender's wall time
}

// workload runs transfers from the lab's client to its server.
type workload interface {
	// run moves data for d; started runs just before the sender starts,
	// so that the caller's measurement leaves the receiver's set-up out.
	run(ctx context.Context, d time.Duration, started func()) (transfer, error)
	close()
}

// iperf3Server is one `iperf3 -s` in the server namespace for every run.
type iperf3Server struct {
	lab *netlab.Lab
	srv *exec.Cmd
}

func startIperf3(lab *netlab.Lab) (*iperf3Server, error) {
	// --forceflush: its "Server listening" line is the sign it is ready,
	// and a pipe would otherwise hold it back.
	srv := lab.Command(lab.Server, "iperf3", "-s", "-B", lab.Server.Addr.String(), "-p", strconv.Itoa(dataPort), "--forceflush")
	out, err := srv.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr strings.Builder
	srv.Stderr = &stderr
	if err := srv.Start(); err != nil {
		return nil, fmt.Errorf("start iperf3 server: %w", err)
	}
	lines := bufio.NewScanner(out)
	for lines.Scan() {
		if strings.Contains(lines.Text(), "Server listening") {
			// Keep draining its reports so that it never blocks on a
			// full pipe.
			go func() { _, _ = io.Copy(io.Discard, out) }()
			return &iperf3Server{lab: lab, srv: srv}, nil
		}
	}
	_ = srv.Process.Kill()
	_ = srv.Wait()
	return nil, fmt.Errorf("iperf3 server did not start: %s", tracerproc.OneLine(stderr.String()))
}

func (s *iperf3Server) close() {
	_ = s.srv.Process.Kill()
	_ = s.srv.Wait()
}

// iperf3Result is the part of iperf3 -J's report read here.
type iperf3Result struct {
	End struct {
		SumSent struct {
			Bytes   uint64  `json:"bytes"`
			Seconds float64 `json:"seconds"`
		} `json:"sum_sent"`
		SumReceived struct {
			Bytes   uint64  `json:"bytes"`
			Seconds float64 `json:"seconds"`
		} `json:"sum_received"`
	} `json:"end"`
	Error string `json:"error"`
}

// parseIperf3 reads a client's -J report.
func parseIperf3(b []byte) (transfer, error) {
	var r iperf3Result
	if err := json.Unmarshal(b, &r); err != nil {
		return transfer{}, fmt.Errorf("iperf3 report: %w", err)
	}
	if r.Error != "" {
		return transfer{}, fmt.Errorf("iperf3: %s", r.Error)
	}
	if r.End.SumReceived.Bytes == 0 || r.End.SumReceived.Seconds <= 0 {
		return transfer{}, fmt.Errorf("iperf3 report: nothing received")
	}
	return transfer{Sent: r.End.SumSent.Bytes, Received: r.End.SumReceived.Bytes, Seconds: r.End.SumReceived.Seconds}, nil
}

func (s *iperf3Server) run(ctx context.Context, d time.Duration, started func()) (transfer, error) {
	ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	secs := strconv.Itoa(int(d.Round(time.Second) / time.Second))
	cli := exec.CommandContext(ctx, "ip", "netns", "exec", s.lab.Client.NS,
		"iperf3", "-c", s.lab.Server.Addr.String(), "-p", strconv.Itoa(dataPort), "-t", secs, "-J")
	var stderr strings.Builder
	cli.Stderr = &stderr
	started()
	out, err := cli.Output()
	if err != nil {
		if t, perr := parseIperf3(out); perr != nil {
			return t, fmt.Errorf("iperf3 client: %v: %s %s", err, tracerproc.OneLine(stderr.String()), perr)
		}
		return transfer{}, fmt.Errorf("iperf3 client: %v: %s", err, tracerproc.OneLine(stderr.String()))
	}
	return parseIperf3(out)
}

// magnetFlood is `magnet workload`: a flood of 64 KiB messages over one
// connection, a receiver started for each run.
type magnetFlood struct {
	lab *netlab.Lab
	bin string
}

func (m *magnetFlood) close() {}

func (m *magnetFlood) run(ctx context.Context, d time.Duration, started func()) (transfer, error) {
	ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	addr := fmt.Sprintf("%s:%d", m.lab.Server.Addr, dataPort)
	srv := exec.CommandContext(ctx, "ip", "netns", "exec", m.lab.Server.NS, m.bin, "workload", "serve", "--proto", "tcp", "--listen", addr)
	out, err := srv.StdoutPipe()
	if err != nil {
		return transfer{}, err
	}
	var srvErr strings.Builder
	srv.Stderr = &srvErr
	if err := srv.Start(); err != nil {
		return transfer{}, fmt.Errorf("start magnet workload serve: %w", err)
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	lines := bufio.NewScanner(out)
	if !lines.Scan() || !strings.HasPrefix(lines.Text(), "listening") {
		return transfer{}, fmt.Errorf("magnet workload serve did not start: %s", tracerproc.OneLine(srvErr.String()))
	}
	cli := exec.CommandContext(ctx, "ip", "netns", "exec", m.lab.Client.NS, m.bin, "workload", "send", "--proto", "tcp", "--to", addr, "--flood", d.String(), "--size", "65536")
	var cliErr strings.Builder
	cli.Stderr = &cliErr
	started()
	start := time.Now()
	sentLine, err := cli.Output()
	if err != nil {
		return transfer{}, fmt.Errorf("magnet workload send: %v: %s", err, tracerproc.OneLine(cliErr.String()))
	}
	secs := time.Since(start).Seconds()
	var t transfer
	var n uint64
	if _, err := fmt.Sscanf(lastLine(string(sentLine)), "sent %d bytes in %d messages", &t.Sent, &n); err != nil {
		return transfer{}, fmt.Errorf("magnet workload send said %q", tracerproc.OneLine(string(sentLine)))
	}
	var last string
	for lines.Scan() {
		last = lines.Text()
	}
	if _, err := fmt.Sscanf(last, "received %d bytes in %d reads", &t.Received, &n); err != nil {
		return transfer{}, fmt.Errorf("magnet workload serve said %q: %s", last, tracerproc.OneLine(srvErr.String()))
	}
	t.Seconds = secs
	return t, nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
