// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// Levels are the resolutions the renderer can send a frame at, best first:
// each halves the width and height of the one before, a quarter of the
// bytes.
var Levels = []string{"full", "half", "quarter", "eighth", "sixteenth"}

// FrameBytes is the size of a frame at level lv when a full frame is full
// bytes.
func FrameBytes(full, lv int) int { return max(full>>(2*lv), 1) }

// Choose returns the level to send at when the connection carries bps bits
// per second: the best resolution whose frames still arrive at fps frames
// per second. Moving up from cur (to a better level) needs 10 % to spare,
// so that a figure near a boundary does not flip the level back and forth.
func Choose(bps float64, full int, fps float64, cur int) int {
	for lv := range Levels {
		need := float64(FrameBytes(full, lv)) * 8 * fps
		if lv < cur {
			need *= 1.1
		}
		if need <= bps {
			return lv
		}
	}
	return len(Levels) - 1
}

// Config is how the sender adapts.
type Config struct {
	FullFrame int           // bytes of a full-resolution frame
	FPS       float64       // frames per second the display wants
	Every     time.Duration // how often to ask the daemon
	Window    time.Duration // the daemon's time window for the bandwidth
}

// Decision is one answer of the daemon and the level chosen from it.
type Decision struct {
	Elapsed    time.Duration // since sending began
	BPS        float64       // the daemon's figure: app-level send rate of our connection
	Level      int
	FrameBytes int
}

// Result is what Send did.
type Result struct {
	Conn      uint64 // the connection's id in the daemon
	Bytes     int64  // bytes written, as the application counts them
	Frames    int
	Elapsed   time.Duration // from the first write to the end
	Decisions []Decision    // every answer, in order
}

// Send writes frames back to back on conn until ctx ends, at the level
// chosen from the daemon's bandwidth figure for conn, asked every
// cfg.Every (MAGNET 2.0's pull mode). onChange, if not nil, is called each
// time the level changes, and for the first decision.
func Send(ctx context.Context, conn *net.TCPConn, mc *magnetclient.Client, cfg Config, onChange func(Decision)) (Result, error) {
	var res Result
	var level atomic.Int64 // start at the best level: the daemon will tell
	var written atomic.Int64
	var frames atomic.Int64
	start := time.Now()

	// The renderer: frames back to back, as fast as the socket takes them,
	// so the send rate the daemon sees is what the network carries.
	writeErr := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, cfg.FullFrame)
		for i := range buf {
			buf[i] = byte(i * 7) // an image of sorts
		}
		for {
			n, err := conn.Write(buf[:FrameBytes(cfg.FullFrame, int(level.Load()))])
			written.Add(int64(n))
			if err != nil {
				writeErr <- err
				return
			}
			frames.Add(1)
		}
	}()
	stop := func() {
		conn.SetWriteDeadline(time.Now()) // unblocks the writer
		wg.Wait()
		res.Bytes, res.Frames, res.Elapsed = written.Load(), int(frames.Load()), time.Since(start)
	}

	id, err := findConn(ctx, mc, conn)
	if err != nil {
		stop()
		return res, err
	}
	res.Conn = id

	tick := time.NewTicker(cfg.Every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			stop()
			return res, nil
		case err := <-writeErr:
			stop()
			return res, fmt.Errorf("send frames: %w", err)
		case <-tick.C:
		}
		bw, err := mc.Bandwidth(ctx, id, magnetclient.BandwidthQuery{Layer: "app", Dir: "send", Window: cfg.Window})
		if err != nil {
			if ctx.Err() != nil {
				continue
			}
			stop()
			return res, fmt.Errorf("ask the daemon: %w", err)
		}
		if bw.Events < 2 || time.Since(start) < cfg.Window {
			// Nothing measured yet, or the connection is younger than the
			// window: the rate over a window not yet full is too low.
			continue
		}
		cur := int(level.Load())
		lv := Choose(bw.BPS, cfg.FullFrame, cfg.FPS, cur)
		d := Decision{Elapsed: time.Since(start), BPS: bw.BPS, Level: lv, FrameBytes: FrameBytes(cfg.FullFrame, lv)}
		res.Decisions = append(res.Decisions, d)
		if lv != cur || len(res.Decisions) == 1 {
			level.Store(int64(lv))
			if onChange != nil {
				onChange(d)
			}
		}
	}
}

// findConn asks the daemon for the connection of conn: owned by this
// process, with conn's ports. The daemon learns the owner from the first
// socket call, so it may take a moment.
func findConn(ctx context.Context, mc *magnetclient.Client, conn *net.TCPConn) (uint64, error) {
	local, lok := conn.LocalAddr().(*net.TCPAddr)
	remote, rok := conn.RemoteAddr().(*net.TCPAddr)
	if !lok || !rok {
		return 0, errors.New("not a TCP connection")
	}
	f := magnetclient.Filter{
		PIDs:        []uint32{uint32(os.Getpid())},
		LocalPorts:  []uint16{uint16(local.Port)},
		RemotePorts: []uint16{uint16(remote.Port)},
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		cs, err := mc.Connections(ctx, f, magnetclient.Window{})
		if err != nil && ctx.Err() == nil {
			return 0, fmt.Errorf("find our connection: %w", err)
		}
		for _, c := range cs {
			if c.CloseNs == 0 {
				return c.ID, nil
			}
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("the daemon does not know our connection %v -> %v", local, remote)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
