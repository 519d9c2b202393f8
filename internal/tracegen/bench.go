// SPDX-License-Identifier: Apache-2.0

package tracegen

import (
	"bufio"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// Environment of Bench.
const (
	// EnvEvents sets the size of the benchmarks' trace (default 1,000,000).
	EnvEvents = "MAGNET_BENCH_EVENTS"
	// EnvTrace names a file to keep the benchmarks' trace in: made if it
	// does not exist, reused if it does (so bench/analysis.sh can run the
	// magnet binary over the same trace).
	EnvTrace = "MAGNET_BENCH_TRACE"
)

// Bench runs fn b.N times over a synthetic trace (its records counted as
// events) and reports:
//   - events/s: events per second of wall time;
//   - events/cpu-s: events per second of the process's CPU time (user and
//     system, garbage collection included): on a shared machine, the figure
//     for "on one core";
//   - peak-heap-MB: the most heap the process held in objects while fn ran,
//     sampled every millisecond.
func Bench(b *testing.B, fn func(path string) error) {
	path, n := benchTrace(b)
	runtime.GC() // what making the trace left is not the benchmark's
	b.ResetTimer()
	peak := sampleHeap()
	c0 := cpuNs()
	for range b.N {
		if err := fn(path); err != nil {
			b.Fatal(err)
		}
	}
	cpu := cpuNs() - c0
	b.StopTimer()
	b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(b.N*n)/(float64(cpu)/1e9), "events/cpu-s")
	b.ReportMetric(float64(peak())/(1<<20), "peak-heap-MB")
}

func benchTrace(b *testing.B) (string, int) {
	events := 1_000_000
	if s := os.Getenv(EnvEvents); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v <= 0 {
			b.Fatalf("%s=%q: want a number of events", EnvEvents, s)
		}
		events = v
	}
	path := os.Getenv(EnvTrace)
	if path == "" {
		path = filepath.Join(b.TempDir(), "synth.mgt")
	} else if n, ok := records(path); ok {
		return path, n
	}
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)
	n, err := Write(w, Options{Events: events})
	if err != nil {
		b.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(path+".events", []byte(strconv.Itoa(n)), 0o644); err != nil {
		b.Fatal(err)
	}
	return path, n
}

// records returns the record count noted beside a kept trace.
func records(path string) (int, bool) {
	if _, err := os.Stat(path); err != nil {
		return 0, false
	}
	s, err := os.ReadFile(path + ".events")
	if err != nil {
		return 0, false
	}
	n, err := strconv.Atoi(string(s))
	return n, err == nil
}

func cpuNs() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// sampleHeap starts sampling the heap's object bytes; the returned function
// stops and returns the peak.
func sampleHeap() func() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	var peak uint64
	read := func() {
		metrics.Read(s)
		if v := s[0].Value.Uint64(); v > peak {
			peak = v
		}
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				read()
			}
		}
	}()
	return func() uint64 {
		close(stop)
		<-done
		read()
		return peak
	}
}
