// SPDX-License-Identifier: Apache-2.0

// Package collectcmd is the `magnet collect` command: the always-on service.
package collectcmd

import (
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/magnet-tracer/magnet/internal/collect"
	"github.com/magnet-tracer/magnet/internal/outfile"
)

// New returns the collect command.
func New() *cobra.Command {
	var configPath, readyFile string
	var shipOnly bool
	cmd := &cobra.Command{
		Use:   "collect --config FILE",
		Short: "The collection service: record with rotation, ship finished files to archives, repeat",
		Long: `Run the collection service: record continuously into a spool directory,
starting a new file every rotate.interval (or rotate.size), and ship each
finished file -- zstd-compressed, verified by size and SHA-256 -- to every
target (a directory, a host over SSH, an S3-compatible object store) as
HOST/YYYY-MM-DD/FILE.mgt.zst beside its manifest. A file is deleted locally
only once every target has confirmed it; while a target is unreachable files
queue in the spool, within disk_budget (beyond it the oldest finished files
are dropped, logged and counted in SPOOL/.dropped.log). A restart resumes
where the last run stopped, even after SIGKILL: no half file in an archive,
none shipped twice. The shipping runs in a child process in a cgroup the
recorder excludes, so its traffic never appears in the traces.

docs/COLLECT.md documents every key of the configuration.`,
		Example: `  sudo magnet collect --config /etc/magnet/collect.yaml
  magnet archive ls /srv/magnet-archive`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if configPath == "" {
				return fmt.Errorf("collect: a configuration is required (--config FILE)")
			}
			cfg, err := collect.Load(configPath)
			if err != nil {
				return fmt.Errorf("collect: %w", err)
			}
			logger := log.New(os.Stderr, "magnet collect: ", 0)
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if shipOnly {
				logger.SetPrefix("magnet collect (shipper): ")
				if err := collect.Ship(ctx, cfg, os.Stdin, logger.Printf); err != nil {
					return fmt.Errorf("collect: ship: %w", err)
				}
				return nil
			}
			// SIGUSR1 fires the flight recorder (flight.window); without
			// one the service logs and ignores it.
			trigger := make(chan string, 1)
			usr1 := make(chan os.Signal, 1)
			signal.Notify(usr1, syscall.SIGUSR1)
			defer signal.Stop(usr1)
			go func() {
				for range usr1 {
					if cfg.Flight.Window == 0 {
						logger.Printf("SIGUSR1 ignored: no flight recorder (flight.window)")
						continue
					}
					select {
					case trigger <- "signal":
					default: // one is pending: it writes the same window
					}
				}
			}()
			opts := collect.Options{ConfigPath: configPath, Log: logger.Printf, Trigger: trigger}
			if readyFile != "" {
				// Through outfile, as every output: a privileged collector must
				// not follow a link another user planted in /tmp.
				opts.Ready = func() {
					if err := outfile.WriteFile(readyFile, []byte("ready\n")); err != nil {
						logger.Printf("warning: --ready-file: %v", err)
					}
				}
			}
			res, err := collect.Run(ctx, cfg, opts)
			if res != nil {
				n, b := collect.Dropped(cfg.Spool)
				logger.Printf("stopped: %d bytes recorded, %d events lost; %d files dropped so far (%d bytes)", res.Bytes, res.Lost, n, b)
			}
			if err != nil {
				return fmt.Errorf("collect: %w", err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&configPath, "config", "c", "", "configuration file (YAML, see docs/COLLECT.md)")
	f.StringVar(&readyFile, "ready-file", "", "write this file once the probes are attached (for scripts and tests)")
	f.BoolVar(&shipOnly, "ship-only", false, "only ship the spool's finished files (the service runs this as its child)")
	_ = f.MarkHidden("ship-only")
	return cmd
}
