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

// FuzzExport feeds arbitrary files to the text listing (of one trace and
// of two merged), the connection table, the table export and the pcapng
// export: whatever the dictionary says, they must not panic.
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
		// The table export, the trace merged with itself.
		var srcs []export.TableSource
		var hs []*trace.Header
		for _, name := range []string{"a", "b"} {
			r, err := trace.NewReader(bytes.NewReader(data))
			if err != nil {
				return
			}
			srcs = append(srcs, export.TableSource{Name: name, Reader: r})
			hs = append(hs, r.Header())
		}
		tb := export.NewTable(hs)
		w, err := export.NewRowWriter("csv", tb, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = export.WriteTable(tb, srcs, w)
		_ = w.Close()
		// The text listing and the pcapng export of the trace merged with
		// itself, in time order and in file order.
		for _, fileOrder := range []bool{false, true} {
			srcs := srcs[:0]
			for _, name := range []string{"a", "b"} {
				r, err := trace.NewReader(bytes.NewReader(data))
				if err != nil {
					return
				}
				srcs = append(srcs, export.TableSource{Name: name, Reader: r})
			}
			_, _ = export.WriteTexts(io.Discard, srcs, export.TextOptions{Meta: true, FileOrder: fileOrder})
		}
		for i, name := range []string{"a", "b"} {
			r, err := trace.NewReader(bytes.NewReader(data))
			if err != nil {
				return
			}
			srcs[i] = export.TableSource{Name: name, Reader: r}
		}
		_, _, _ = export.WritePcapng(io.Discard, srcs)
	})
}
