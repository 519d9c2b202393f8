// SPDX-License-Identifier: Apache-2.0

package cli

import (
	archivecmd "github.com/magnet-tracer/magnet/internal/cli/archive"
	benchcmd "github.com/magnet-tracer/magnet/internal/cli/bench"
	collectcmd "github.com/magnet-tracer/magnet/internal/cli/collect"
	daemoncmd "github.com/magnet-tracer/magnet/internal/cli/daemon"
	"github.com/magnet-tracer/magnet/internal/cli/demo"
	diffcmd "github.com/magnet-tracer/magnet/internal/cli/diff"
	exportcmd "github.com/magnet-tracer/magnet/internal/cli/export"
	hostcheckcmd "github.com/magnet-tracer/magnet/internal/cli/hostcheck"
	"github.com/magnet-tracer/magnet/internal/cli/parse"
	plotcmd "github.com/magnet-tracer/magnet/internal/cli/plot"
	probecmd "github.com/magnet-tracer/magnet/internal/cli/probe"
	"github.com/magnet-tracer/magnet/internal/cli/record"
	"github.com/magnet-tracer/magnet/internal/cli/report"
	"github.com/magnet-tracer/magnet/internal/cli/status"
	"github.com/magnet-tracer/magnet/internal/cli/watch"
	workloadcmd "github.com/magnet-tracer/magnet/internal/cli/workload"
)

func init() {
	subcommands = append(subcommands, record.New, parse.New, report.New, plotcmd.New, exportcmd.New, hostcheckcmd.New, benchcmd.New, demo.New, status.New, workloadcmd.New, archivecmd.New, collectcmd.New, daemoncmd.New, watch.New, probecmd.New, diffcmd.New)
}
