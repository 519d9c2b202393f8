// SPDX-License-Identifier: Apache-2.0

package exportcmd

import (
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/magnet-tracer/magnet/internal/archive"
	"github.com/magnet-tracer/magnet/internal/export"
)

// datasetFlags are export's --dataset mode: a Hive-partitioned Parquet
// dataset for Spark, Trino and DuckDB, written incrementally.
type datasetFlags struct {
	dir       string
	partition []string
	quiet     bool
}

func (d *datasetFlags) register(f *pflag.FlagSet) {
	f.StringVar(&d.dir, "dataset", "", "with --format parquet: write a Hive-partitioned dataset under DIR (events/ and conns/ trees, one file per trace file; a second run adds only new files)")
	f.StringSliceVar(&d.partition, "partition", []string{"host", "date"}, "with --dataset: the partition directory levels, in order (host, date)")
	f.BoolVar(&d.quiet, "quiet", false, "with --dataset: no line per file")
}

func (d *datasetFlags) run(cmd *cobra.Command, args []string, format, output string, sel *archive.Flags) error {
	if format != "parquet" {
		return fmt.Errorf("export: --dataset writes Parquet: add --format parquet")
	}
	if output != "" {
		return fmt.Errorf("export: --dataset writes its own files: leave out -o")
	}
	if err := export.CheckPartition(d.partition); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	s, err := sel.Selection(time.Now())
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	// Files already in the dataset are left out before anything is read
	// or downloaded: a second run over a whole archive fetches only what
	// is new.
	there := 0
	s.Skip = func(e *archive.Entry) bool {
		if export.DatasetHas(d.dir, e.Host, e.StartWallNs, e.Path, d.partition) {
			there++
			return true
		}
		return false
	}
	inputs, cleanup, err := archive.Resolve(args, s)
	if errors.Is(err, archive.ErrNoMatch) && there > 0 {
		fmt.Fprintf(cmd.ErrOrStderr(), "magnet export: dataset %s: 0 files written, %d already there\n", d.dir, there)
		return nil
	}
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	defer cleanup()
	var paths []string
	for _, in := range inputs {
		paths = append(paths, in.Paths...)
	}
	logger := log.New(os.Stderr, "magnet export: ", 0)
	opts := export.DatasetOptions{Partition: d.partition, Log: logger.Printf}
	if d.quiet {
		opts.Log = nil
	}
	start := time.Now()
	st, err := export.WriteDataset(d.dir, paths, opts)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	el := time.Since(start)
	fmt.Fprintf(cmd.ErrOrStderr(), "magnet export: dataset %s: %d files written (%d events, %d connections in %s), %d already there\n",
		d.dir, st.Written, st.Events, st.Conns, el.Round(time.Millisecond), st.Skipped+there)
	return nil
}
