// SPDX-License-Identifier: Apache-2.0

package record_test

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/record"
	"github.com/magnet-tracer/magnet/internal/rotate"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// soakDuration is how long TestRotationSoak records: 20 s in CI, longer
// with MAGNET_SOAK=2h (scripts/soak.sh), a few seconds with -short.
func soakDuration(t *testing.T) time.Duration {
	if s := os.Getenv("MAGNET_SOAK"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("MAGNET_SOAK=%q: %v", s, err)
		}
		return d
	}
	if testing.Short() {
		return 5 * time.Second
	}
	return 20 * time.Second
}

// TestRotationSoak records steady traffic through a rotating sink that
// starts a new file every second (MAGNET_SOAK_ROTATE): every seam is exact
// (the chain holds exactly the records the recorder counted, type by type,
// none twice, and each file starts where the previous ended), and the
// recorder's memory stays flat.
func TestRotationSoak(t *testing.T) {
	needRoot(t)
	total := soakDuration(t)
	every := time.Second
	if s := os.Getenv("MAGNET_SOAK_ROTATE"); s != "" {
		every, _ = time.ParseDuration(s)
	}
	lab := netlab.ForTest(t, netlab.Options{Name: "mgsoak", RateMbit: 20})
	port := uniquePort()
	dir := t.TempDir()
	pat, err := rotate.ParsePattern(filepath.Join(dir, "%h-%Y%m%dT%H%M%S.mgt"), "soak")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var files []string
	var heap []uint64
	var sink *rotate.Sink
	rec := startRecording(t, record.Config{
		Filters: record.Filters{Port: port},
		NewSink: func(h *trace.Header) (record.Sink, error) {
			s, err := rotate.New(h, rotate.Options{Pattern: pat, Interval: every, OnFinish: func(p string) {
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				mu.Lock()
				files = append(files, p)
				heap = append(heap, ms.HeapInuse)
				mu.Unlock()
			}})
			sink = s
			return s, err
		},
	})
	addr := fmt.Sprintf("%s:%d", lab.Server.Addr, port)
	srv, srvOut := serve(t, lab, lab.Server, "--proto", "tcp", "--listen", addr)
	cli := lab.Command(lab.Client, magnetBin, "workload", "send", "--proto", "tcp", "--to", addr, "--flood", total.String(), "--size", "1024")
	if out, err := cli.CombinedOutput(); err != nil {
		t.Fatalf("client: %v %s", err, out)
	}
	srvOut.Scan()
	srv.Wait()
	res := rec.stop(t)

	mu.Lock()
	defer mu.Unlock()
	if want := int(total / every); len(files) < want/2 {
		t.Fatalf("%d files in %s with rotation every %s", len(files), total, every)
	}
	if st := sink.Stats(); st.Files != int64(len(files)) || st.Dropped != 0 {
		t.Fatalf("sink stats %+v, %d files finished", st, len(files))
	}

	// The chain, read as one timeline, holds exactly what the recorder
	// wrote, type by type.
	r, err := trace.OpenChain(files)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := map[string]uint64{}
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[rec.Type.Name]++
		// The first file has nothing to carry: any carried copy seen here
		// would be counted twice.
		if rec.Flags()&trace.FlagCarried != 0 && (rec.Type.Name == "task" || rec.Type.Name == "conn_open" || rec.Type.Name == "iface") {
			t.Fatalf("a carried %s record came through the chain", rec.Type.Name)
		}
	}
	if w := r.Warnings(); len(w) > 0 {
		t.Fatalf("chain warnings: %v", w)
	}
	for name, n := range res.Events {
		if got[name] != n {
			t.Errorf("%s: chain has %d, the recorder wrote %d", name, got[name], n)
		}
	}
	for name, n := range got {
		if res.Events[name] != n {
			t.Errorf("%s: chain has %d, the recorder wrote %d", name, n, res.Events[name])
		}
	}
	if res.Events["sock_send"] == 0 {
		t.Fatal("no sock_send recorded")
	}

	// Seam by seam: the next file starts at the record and time where the
	// previous one ended (events of different CPUs may cross a seam by a
	// little: the rings deliver them in drain order).
	var prevEnd *trace.RotationEnd
	var prevLast uint64
	for i, p := range files {
		f, err := trace.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		rot := f.Rotation()
		var first, last uint64
		n := uint64(0)
		for {
			rec, err := f.Next()
			if err != nil {
				break
			}
			if n >= rot.Carried && first == 0 {
				first = rec.Time()
			}
			last = max(last, rec.Time())
			n++
		}
		end := f.RotationEnd()
		f.Close()
		if end == nil || n-rot.Carried != end.Records {
			t.Fatalf("%s: %d records (%d carried), end %+v", p, n, rot.Carried, end)
		}
		if i > 0 {
			if rot.FirstRecord != prevEnd.NextRecord || rot.Prev != filepath.Base(files[i-1]) || rot.PrevLastNs != prevLast {
				t.Fatalf("seam %d: %+v after %+v (prev last %d)", i, rot, prevEnd, prevLast)
			}
			if first != 0 && first+uint64(50*time.Millisecond) < prevLast {
				t.Errorf("seam %d: first event %d ns before the previous file's last", i, prevLast-first)
			}
		}
		prevEnd, prevLast = end, last
	}

	// Memory: the heap when the last quarter of the files finished is not
	// above what it was in the second quarter, give or take.
	q := len(heap) / 4
	if q > 0 {
		var early, late uint64
		for _, h := range heap[q : 2*q] {
			early = max(early, h)
		}
		for _, h := range heap[3*q:] {
			late = max(late, h)
		}
		t.Logf("heap in use: %s MiB early, %s MiB late", mib(early), mib(late))
		if late > early+early/2+8<<20 {
			t.Errorf("heap grew from %s to %s MiB over the soak", mib(early), mib(late))
		}
	}
	t.Logf("%s soak: %d files, %d events, %d lost", total, len(files), res.Events["sock_send"], res.Lost)
}

func mib(n uint64) string { return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) }
