// SPDX-License-Identifier: Apache-2.0

// Package fault holds test-only fault points: named places at the
// dangerous steps of the rotation handover and of a shipment, where a test
// can have the process stop so that it kills it at exactly that step
// instead of at a random moment.
//
// A process started with MAGNET_FAULT=NAME stops at the point NAME: it
// writes its pid to the file MAGNET_FAULT_MARKER (when set) and then sleeps
// for good, waiting for the test's SIGKILL. In a normal run MAGNET_FAULT is
// unset and a point is one comparison with an empty string: it costs
// nothing and does nothing.
//
// The points (docs/COLLECT.md says what a kill at each leaves behind):
//
//	rotate:after-finish   the old file ended (end block, fsync, unlocked), the next not yet created
//	rotate:before-rename  the next file written under its dot-name (.NAME.new), not yet renamed
//	rotate:after-rename   the next file in place (header, carried records), none of its own records yet
//	ship:after-stage      the compressed copy and manifest staged, the journal not yet told
//	ship:before-rename    (dir target) the copy written and verified as .NAME.part, not yet renamed
//	ship:after-upload     the trace in the archive, its manifest not yet
//	ship:after-manifest   trace and manifest in the archive, the journal not yet told
//	ship:after-journal    the journal says shipped, the local file not yet deleted
//	ship:after-delete     the local file and staging copies deleted, the journal not yet told
package fault

import (
	"os"
	"strconv"
	"time"
)

// armed is the point this process stops at; "" in every normal run.
var armed = os.Getenv("MAGNET_FAULT")

// At is the fault point name.
func At(name string) {
	if armed == "" || armed != name {
		return
	}
	stop()
}

func stop() {
	if m := os.Getenv("MAGNET_FAULT_MARKER"); m != "" {
		tmp := m + ".tmp"
		if os.WriteFile(tmp, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644) == nil {
			os.Rename(tmp, m)
		}
	}
	for {
		time.Sleep(time.Hour)
	}
}
