// SPDX-License-Identifier: Apache-2.0

package export_test

import (
	"bytes"
	"io"
	"os"
	"testing"

	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// FuzzExport feeds arbitrary files to the text listing and the connection
// table: whatever the dictionary says, they must not panic.
func FuzzExport(f *testing.F) {
	if seed, err := os.ReadFile("../../testdata/bigendian.mgt"); err == nil {
		f.Add(seed)
		f.Add(seed[:len(seed)/2])
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, tf := range []export.TimeFormat{export.TimeRelative, export.TimeAbsolute, export.TimeRaw} {
			r, err := trace.NewReader(bytes.NewReader(data))
			if err != nil {
				return
			}
			_ = export.WriteText(io.Discard, r, export.TextOptions{Time: tf, Meta: true})
		}
		r, err := trace.NewReader(bytes.NewReader(data))
		if err != nil {
			return
		}
		cs, start, _ := export.Conns(r)
		_ = export.WriteConns(io.Discard, cs, start)
	})
}
