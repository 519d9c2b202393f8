// SPDX-License-Identifier: Apache-2.0

// Command adaptive is MAGNET 2.0's adaptive application, today: a renderer
// streams frames to a display and picks their resolution from the
// bandwidth magnet's daemon measures for its own connection. When the
// network gets slower it sends smaller frames, so the display keeps its
// frame rate; when the network recovers, it goes back to full resolution.
//
//	adaptive serve --listen 10.0.0.2:9000          # the display: reads frames, discards them
//	adaptive send --to 10.0.0.2:9000 --fps 25      # the renderer (magnet daemon must run)
//
// The sender asks the daemon (pkg/magnetclient) every --every for the
// application-level send rate of its connection over the last --window,
// and chooses the best resolution whose frames still fit --fps at that
// rate. It prints each change of level.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "adaptive: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return errors.New("want a command: serve or send (adaptive send -h for help)")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch args[0] {
	case "serve":
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		listen := fs.String("listen", "", "address to listen on, host:port")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *listen == "" {
			return errors.New("serve: --listen is required")
		}
		return serve(ctx, *listen)
	case "send":
		fs := flag.NewFlagSet("send", flag.ContinueOnError)
		to := fs.String("to", "", "the display's address, host:port")
		socket := fs.String("socket", magnetclient.DefaultSocket, "magnet daemon's socket")
		fps := fs.Float64("fps", 25, "frames per second the display wants")
		frame := fs.Int("frame", 1<<20, "bytes of a full-resolution frame")
		every := fs.Duration("every", 200*time.Millisecond, "how often to ask the daemon")
		window := fs.Duration("window", time.Second, "time window of the daemon's bandwidth figure")
		duration := fs.Duration("duration", 0, "stop after this long (0: until interrupted)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		switch {
		case *to == "":
			return errors.New("send: --to is required")
		case *fps <= 0 || *frame < 1024 || *every < 10*time.Millisecond || *window < 10*time.Millisecond:
			return errors.New("send: want --fps > 0, --frame >= 1024, --every and --window >= 10ms")
		}
		if *duration > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, *duration)
			defer cancel()
		}
		mc, err := magnetclient.Dial(*socket)
		if err != nil {
			return err
		}
		defer mc.Close()
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", *to)
		if err != nil {
			return err
		}
		defer c.Close()
		cfg := Config{FullFrame: *frame, FPS: *fps, Every: *every, Window: *window}
		res, err := Send(ctx, c.(*net.TCPConn), mc, cfg, func(d Decision) {
			fmt.Printf("%6.1fs  %9s  -> %-9s %8d-byte frames\n", d.Elapsed.Seconds(), rate(d.BPS), Levels[d.Level], d.FrameBytes)
		})
		if err != nil {
			return err
		}
		fmt.Printf("sent %d frames, %d bytes in %.1fs (%s) on connection %d\n",
			res.Frames, res.Bytes, res.Elapsed.Seconds(), rate(float64(res.Bytes)*8/res.Elapsed.Seconds()), res.Conn)
		return nil
	}
	return fmt.Errorf("unknown command %q: want serve or send", args[0])
}

// serve accepts displays' connections and reads everything they send.
func serve(ctx context.Context, addr string) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	fmt.Printf("listening %s\n", ln.Addr())
	context.AfterFunc(ctx, func() { ln.Close() })
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go func() {
			defer c.Close()
			io.Copy(io.Discard, c)
		}()
	}
}

func rate(bps float64) string {
	switch {
	case bps >= 1e9:
		return fmt.Sprintf("%.2f Gbit/s", bps/1e9)
	case bps >= 1e6:
		return fmt.Sprintf("%.1f Mbit/s", bps/1e6)
	}
	return fmt.Sprintf("%.0f kbit/s", bps/1e3)
}
