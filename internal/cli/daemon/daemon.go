// SPDX-License-Identifier: Apache-2.0

// Package daemoncmd is the `magnet daemon` command.
package daemoncmd

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/magnet-tracer/magnet/internal/daemon"
	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/evselect"
	"github.com/magnet-tracer/magnet/internal/outfile"
)

// New returns the daemon command.
func New() *cobra.Command {
	var configFile, socket, listen, tokenFile, events, buffer, readyFile, cpuProfile string
	cmd := &cobra.Command{
		Use:   "daemon [--config FILE]",
		Short: "Record for the whole host and serve live events and per-connection figures",
		Long: `Run magnet's daemon (MAGNET 2.0's magnetd): one recorder for the host, however
many clients, and an HTTP/JSON API on a Unix socket to pull per-connection
figures (bandwidth over the last 1000 receive events, TCP state, the kernel's
delivery rate, ...) or subscribe to filtered event streams. See docs/DAEMON.md.

SIGTERM or SIGINT: drain, end every stream cleanly, exit 0. SIGHUP: reload
the configuration file.

Event groups (--groups: the baseline, always enabled; subscriptions enable
more while they last):
` + event.GroupHelp(),
		Example: `  sudo magnet daemon
  sudo magnet daemon --config /etc/magnet/magnetd.yaml
  sudo magnet daemon --listen :9437 --token-file /etc/magnet/token
  curl --unix-socket /run/magnet.sock http://magnet/v1/connections`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			flags := cmd.Flags()
			load := func() (daemon.Config, error) {
				cfg := daemon.DefaultConfig()
				if configFile != "" {
					var err error
					if cfg, err = daemon.LoadConfig(configFile); err != nil {
						return cfg, err
					}
				}
				// Flags given on the command line win over the file.
				if flags.Changed("socket") {
					cfg.Socket = socket
				}
				if flags.Changed("listen") {
					cfg.Listen = listen
				}
				if flags.Changed("token-file") {
					cfg.TokenFile = tokenFile
				}
				if flags.Changed("groups") {
					if strings.TrimSpace(events) == "" {
						return cfg, fmt.Errorf("--groups is empty: name the groups always enabled, or omit it for the baseline (%s)", daemon.BaselineGroups)
					}
					cfg.Events.Baseline = daemon.Groups(events)
				}
				if flags.Changed("buffer") {
					cfg.Buffer = buffer
				}
				return cfg, nil
			}
			cfg, err := load()
			if err != nil {
				return fmt.Errorf("daemon: %w", err)
			}
			var profile *os.File
			if cpuProfile != "" {
				// Where the daemon's own CPU goes once it records (the
				// loading before is not what a profile is wanted for).
				if profile, err = outfile.Create(cpuProfile, outfile.Options{}); err != nil {
					return fmt.Errorf("daemon: cpu profile: %w", err)
				}
				defer profile.Close()
				defer pprof.StopCPUProfile()
			}
			opts := daemon.Options{}
			opts.Ready = func() {
				if profile != nil {
					if err := pprof.StartCPUProfile(profile); err != nil {
						fmt.Fprintf(os.Stderr, "magnet daemon: cpu profile: %v\n", err)
					}
				}
				if readyFile != "" {
					// Through outfile, as every output: a root daemon must not
					// follow a link another user planted in /tmp.
					if err := outfile.WriteFile(readyFile, []byte("ready\n")); err != nil {
						fmt.Fprintf(os.Stderr, "magnet daemon: warning: --ready-file: %v\n", err)
					}
				}
			}
			d, err := daemon.New(cfg, opts)
			if err != nil {
				if errors.Is(err, os.ErrPermission) {
					return fmt.Errorf("daemon: %w (run the daemon as root)", err)
				}
				return fmt.Errorf("daemon: %w", err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			usr1 := make(chan os.Signal, 1)
			signal.Notify(usr1, syscall.SIGUSR1)
			defer signal.Stop(usr1)
			go func() {
				for {
					select {
					case <-ctx.Done():
						return
					case <-usr1:
						if err := d.TriggerFlight("signal"); err != nil {
							fmt.Fprintf(os.Stderr, "magnet daemon: SIGUSR1: %v\n", err)
						}
					case <-hup:
						cfg, err := load()
						if err == nil {
							err = d.Reload(cfg)
						}
						if err != nil {
							fmt.Fprintf(os.Stderr, "magnet daemon: reload: %v; keeping the running configuration\n", err)
						}
					}
				}
			}()
			return d.Run(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&configFile, "config", "", "YAML configuration file (docs/DAEMON.md#configuration)")
	f.StringVar(&socket, "socket", daemon.DefaultSocket, "Unix socket of the API")
	f.StringVar(&listen, "listen", "", "also serve on this TCP address (host defaults to 127.0.0.1); needs --token-file")
	f.StringVar(&tokenFile, "token-file", "", "file whose first line is the bearer token the TCP listener requires")
	evselect.RegisterRecordGroups(f, &events, daemon.BaselineGroups.String(), "event groups always enabled (the baseline; --events is the same)")
	f.StringVar(&buffer, "buffer", "8MiB", "kernel ring buffer size, a power of two (e.g. 8MiB, 256 KiB)")
	f.StringVar(&readyFile, "ready-file", "", "write this file once recording and serving (for scripts and tests)")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a Go CPU profile of the daemon, from when it is ready, to this file (go tool pprof)")
	_ = f.MarkHidden("cpuprofile")
	return cmd
}
