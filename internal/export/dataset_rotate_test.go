// SPDX-License-Identifier: Apache-2.0

package export_test

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/tracegen"
)

// rotatedWithConn writes a recording of two one-minute files: a
// conn_open of connection 7 at the start, then a sock_send of it every
// second.
func rotatedWithConn(t *testing.T, dir string) []string {
	t.Helper()
	r := tracegen.NewRotated(t, dir, "h", "%h-%n.mgt", time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC))
	open := r.Record("conn_open")
	binary.NativeEndian.PutUint64(open[8:], 7)
	r.Write(open)
	send := r.Record("sock_send")
	binary.NativeEndian.PutUint64(send[8:], 7)
	binary.NativeEndian.PutUint32(send[20:], 100)
	r.EverySecond(send, 120)
	return r.Close()
}
