// SPDX-License-Identifier: Apache-2.0

package netlab

import "fmt"

// SetRate changes the rate limit of both veth ends to rateMbit megabits
// per second, also while traffic flows: tc changes the tbf qdisc in place,
// keeping the packets it holds. A lab made without a rate gets one. It
// must not run concurrently with reads of l.RateMbit.
func (l *Lab) SetRate(rateMbit int) error {
	if rateMbit <= 0 {
		return fmt.Errorf("netlab: rate %d Mbit/s: want more than 0", rateMbit)
	}
	for _, h := range []Host{l.Client, l.Server} {
		if err := addTBF(h.NS, h.Iface, rateMbit); err != nil {
			return fmt.Errorf("netlab: %w", err)
		}
	}
	l.RateMbit = rateMbit
	return nil
}
