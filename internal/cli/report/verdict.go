// SPDX-License-Identifier: Apache-2.0

package report

import (
	"fmt"
	"io"
	"strings"

	"github.com/magnet-tracer/magnet/internal/analyze"
)

// writeVerdict leads a connection with why it went no faster, and the
// figures behind it.
func writeVerdict(w io.Writer, v *analyze.Verdict) {
	if v == nil {
		return
	}
	fmt.Fprintf(w, "  verdict: %s\n", v.Why)
	if v.TransferS > 0 {
		var parts []string
		for _, n := range v.ShareNames() {
			parts = append(parts, fmt.Sprintf("%s %.1f%%", n, 100*v.Shares[n]))
		}
		fmt.Fprintf(w, "    of %.3f s of transfer: %s\n", v.TransferS, strings.Join(parts, ", "))
	}
	for _, e := range v.Evidence {
		fmt.Fprintf(w, "    %s\n", e)
	}
	if r := v.Receiver; r != nil {
		fmt.Fprintf(w, "    receiver: of the data's time from device to application, %.0f%% in the stack (dev_recv to tcp_rcv), %.0f%% in the socket queue waiting for the reader\n",
			100*(1-r.SocketShare), 100*r.SocketShare)
		if r.Reader != nil {
			fmt.Fprintf(w, "    receiver's %s\n", readerLine(r.Reader))
		}
	}
	if len(v.Missing) > 0 {
		fmt.Fprintf(w, "    not decided for lack of events; record these groups: %s\n", strings.Join(v.Missing, "; "))
	}
}
