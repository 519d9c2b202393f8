// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/magnet-tracer/magnet/internal/machine"
	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/tracerproc"
)

// flow is what the workload processes do for the length of a run.
type flow struct {
	proto string
	size  int // bytes per message; churning, per request
	// churn makes one short TCP connection after another, each carrying
	// one size-byte request that the server answers by closing, instead
	// of a flood of messages over one connection.
	churn bool
}

// flood is a flood of size-byte messages over one connection.
func flood(proto string, size int) flow {
	return flow{proto: proto, size: size}
}

// churnFlow is connection churn with size-byte requests.
func churnFlow(size int) flow {
	return flow{proto: "tcp", size: size, churn: true}
}

// serveArgs are the receiver's `magnet workload serve` arguments.
func (f flow) serveArgs(addr string) []string {
	args := []string{"workload", "serve", "--proto", f.proto, "--listen", addr}
	if f.churn {
		args = append(args, "--churn")
	}
	return args
}

// sendArgs are the sender's `magnet workload send` arguments for a run of d.
func (f flow) sendArgs(addr string, d time.Duration) []string {
	mode := "--flood"
	if f.churn {
		mode = "--churn"
	}
	return []string{"workload", "send", "--proto", f.proto, "--to", addr, mode, d.String(), "--size", fmt.Sprint(f.size)}
}

// readLines fills x from the sender's and the receiver's last lines.
func (f flow) readLines(sent, received string, x *Xfer) error {
	if f.churn {
		if _, err := fmt.Sscanf(sent, "sent %d bytes in %d connections", &x.SentBytes, &x.Connections); err != nil {
			return fmt.Errorf("sender said %q", tracerproc.OneLine(sent))
		}
		x.Messages = x.Connections // one request each
		if _, err := fmt.Sscanf(received, "received %d bytes in %d connections", &x.RecvBytes, &x.Accepted); err != nil {
			return fmt.Errorf("receiver said %q", received)
		}
		return nil
	}
	if _, err := fmt.Sscanf(sent, "sent %d bytes in %d messages", &x.SentBytes, &x.Messages); err != nil {
		return fmt.Errorf("sender said %q", tracerproc.OneLine(sent))
	}
	if _, err := fmt.Sscanf(received, "received %d bytes in %d reads", &x.RecvBytes, &x.Reads); err != nil {
		return fmt.Errorf("receiver said %q", received)
	}
	return nil
}

// transfer runs one `magnet workload` flood from the client to the server
// namespace and measures it: bytes received over the sender's wall time
// (connect to the receiver's close, so every byte counted has arrived), the
// CPU time of both processes, and the packets on the veth link.
func (b *bencher) transfer(ctx context.Context, lab *netlab.Lab, proto string, size int, d time.Duration, port int) (*Xfer, error) {
	return b.transferWith(ctx, lab, flood(proto, size), d, port, nil)
}

// transferWith runs f as transfer runs a flood; started, if set, runs once
// the sender has been started (the receiver listening), so that other load
// can start with the transfer rather than with its set-up.
func (b *bencher) transferWith(ctx context.Context, lab *netlab.Lab, f flow, d time.Duration, port int, started func()) (*Xfer, error) {
	proto, size := f.proto, f.size
	addr := fmt.Sprintf("%s:%d", lab.Server.Addr, port)
	ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()

	cBefore, err := linkStats(lab.Client)
	if err != nil {
		return nil, err
	}
	sBefore, err := linkStats(lab.Server)
	if err != nil {
		return nil, err
	}

	cpuBefore, err := machine.ReadCPUTimes()
	if err != nil {
		return nil, err
	}
	srv := b.labCommand(lab, lab.Server, b.opts.Magnet, f.serveArgs(addr)...)
	srvOut, err := srv.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var srvErr strings.Builder
	srv.Stderr = &srvErr
	if err := srv.Start(); err != nil {
		return nil, fmt.Errorf("start receiver: %w", err)
	}
	srvDone := false
	defer func() {
		if !srvDone {
			_ = srv.Process.Kill()
			_ = srv.Wait()
		}
	}()
	lines := bufio.NewScanner(srvOut)
	if !lines.Scan() || !strings.HasPrefix(lines.Text(), "listening") {
		return nil, fmt.Errorf("receiver did not start: %s", tracerproc.OneLine(srvErr.String()))
	}

	cli := b.labCommand(lab, lab.Client, b.opts.Magnet, f.sendArgs(addr, d)...)
	var cliOut, cliErr strings.Builder
	cli.Stdout, cli.Stderr = &cliOut, &cliErr
	start := time.Now()
	if err := cli.Start(); err != nil {
		return nil, fmt.Errorf("start sender: %w", err)
	}
	if started != nil {
		started()
	}
	stop := context.AfterFunc(ctx, func() { _ = cli.Process.Kill() })
	err = cli.Wait()
	wall := time.Since(start)
	stop()
	if err != nil {
		return nil, fmt.Errorf("sender: %s", tracerproc.OneLine(cliErr.String()+" "+err.Error()))
	}
	switch {
	case f.churn:
		// The churn server serves until told to stop. Nothing is in
		// flight: it counted each connection before closing it, and
		// the sender finished each by reading that close.
		_ = srv.Process.Signal(syscall.SIGTERM)
	case proto == "udp":
		// The UDP receiver would wait 2 s for more; what is still in
		// flight arrives well within 200 ms on a veth.
		time.Sleep(200 * time.Millisecond)
		_ = srv.Process.Signal(syscall.SIGTERM)
	}
	var recvLine string
	if lines.Scan() {
		recvLine = lines.Text()
	}
	_, _ = io.Copy(io.Discard, srvOut)
	srvDone = true
	if err := srv.Wait(); err != nil {
		return nil, fmt.Errorf("receiver: %s", tracerproc.OneLine(srvErr.String()+" "+err.Error()))
	}
	cpuAfter, err := machine.ReadCPUTimes()
	if err != nil {
		return nil, err
	}

	x := &Xfer{Proto: proto, Size: size, WallS: wall.Seconds()}
	if err := f.readLines(cliOut.String(), recvLine, x); err != nil {
		return nil, err
	}
	x.SenderCPUS = cpuSeconds(cli.ProcessState)
	x.ReceiverCPUS = cpuSeconds(srv.ProcessState)
	x.setBusy(cpuAfter.BusySince(cpuBefore), cpuAfter.SleepsSince(cpuBefore), cpuAfter.At.Sub(cpuBefore.At), b.pin)

	cAfter, err := linkStats(lab.Client)
	if err != nil {
		return nil, err
	}
	sAfter, err := linkStats(lab.Server)
	if err != nil {
		return nil, err
	}
	x.SenderTxPkts = cAfter.tx - cBefore.tx
	x.ReceiverTxPkt = sAfter.tx - sBefore.tx
	x.LinkPackets = x.SenderTxPkts + x.ReceiverTxPkt
	return x, nil
}

// setBusy keeps what the CPUs did over the transfer (the receiver's start to
// its exit): their busy time summed, and, when each host has a CPU of its
// own, each host's CPU's busy time and sleeps (nil sleeps: not counted).
func (x *Xfer) setBusy(busy map[int]time.Duration, sleeps map[int]uint64, window time.Duration, pin *pinning) {
	x.CPUWindowS = window.Seconds()
	for _, d := range busy {
		x.CPUBusyS += d.Seconds()
	}
	if pin != nil {
		x.SenderVCPUBusyS = busy[pin.sender].Seconds()
		x.ReceiverVCPUBusyS = busy[pin.receiver].Seconds()
		if sleeps != nil {
			s, r := sleeps[pin.sender], sleeps[pin.receiver]
			x.SenderVCPUSleeps, x.ReceiverVCPUSleeps = &s, &r
		}
	}
}

// cpuSeconds is the user plus system time of an exited process and the
// children it waited for, as wait4 reported it.
func cpuSeconds(ps interface{ SysUsage() any }) float64 {
	ru, ok := ps.SysUsage().(*syscall.Rusage)
	if !ok || ru == nil {
		return 0
	}
	return tvSeconds(ru.Utime) + tvSeconds(ru.Stime)
}

func tvSeconds(tv syscall.Timeval) float64 {
	return float64(tv.Sec) + float64(tv.Usec)/1e6
}

type ifStats struct{ rx, tx uint64 }

// linkStats reads a host's veth packet counters, which count a GSO packet
// once, as it crosses the link.
func linkStats(h netlab.Host) (ifStats, error) {
	out, err := exec.Command("ip", "-n", h.NS, "-s", "-j", "link", "show", "dev", h.Iface).Output()
	if err != nil {
		return ifStats{}, fmt.Errorf("read %s counters: %w", h.Iface, err)
	}
	var links []struct {
		Stats64 struct {
			RX struct{ Packets uint64 } `json:"rx"`
			TX struct{ Packets uint64 } `json:"tx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal(out, &links); err != nil || len(links) != 1 {
		return ifStats{}, fmt.Errorf("parse %s counters: %q", h.Iface, tracerproc.OneLine(string(out)))
	}
	return ifStats{rx: links[0].Stats64.RX.Packets, tx: links[0].Stats64.TX.Packets}, nil
}
