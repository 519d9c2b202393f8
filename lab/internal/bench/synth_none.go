// SPDX-License-Identifier: Apache-2.0

//go:build magnet_nosynth

package bench

import (
	"context"
	"time"

	"github.com/magnet-tracer/magnet/internal/netlab"
)

// Built with the tag magnet_nosynth (lab/scripts/cost-before.sh, which builds
// today's bench over an earlier recording path that has no synthetic-event
// programs), the bench has no synthetic measurement.
func (b *bencher) synthStep(context.Context, *netlab.Lab, float64, time.Duration) (*SynthStep, float64, error) {
	return nil, 0, errNoSynth
}
