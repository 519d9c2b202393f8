// SPDX-License-Identifier: Apache-2.0

package record_test

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/record"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// rateSample is one tcp_rate record.
type rateSample struct {
	timeNs, ackNs                  uint64
	newly                          int32
	same                           bool
	delivered, lost                uint64
	rateDelivered, intervalUs, mss uint64
	appLimited                     bool
}

func (s rateSample) bps() float64 {
	return float64(s.rateDelivered*s.mss) * 8 / (float64(s.intervalUs) / 1e6)
}

// sendTCPInfo runs a workload sender in the lab's client and returns the
// kernel's tcpi_delivered once the receiver has closed.
func sendTCPInfo(t *testing.T, lab *netlab.Lab, port int, args ...string) uint64 {
	t.Helper()
	addr := fmt.Sprintf("%s:%d", lab.Server.Addr, port)
	srv, srvOut := serve(t, lab, lab.Server, "--proto", "tcp", "--listen", addr)
	out := run(t, lab.Command(lab.Client, magnetBin, append([]string{"workload", "send", "--proto", "tcp", "--to", addr, "--tcp-info"}, args...)...))
	srvOut.Scan()
	srv.Wait()
	m := regexp.MustCompile(`(?m)^tcpi_delivered (\d+)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("sender printed no tcpi_delivered: %q", out)
	}
	n, _ := strconv.ParseUint(m[1], 10, 32)
	return n
}

// TestRateSamples: the opt-in rate group writes the kernel's delivery-rate
// sample after each ACK that delivered data. A bulk sender over a
// 200 Mbit/s tbf link: delivered strictly increases, the last tcp_rate
// carries what TCP_INFO says at the end, and the median sample not limited
// by the application is near the link rate. A paced sender far below the
// link: its samples are marked app-limited.
func TestRateSamples(t *testing.T) {
	needRoot(t)
	const rateMbit = 200
	lab := netlab.ForTest(t, netlab.Options{Name: "mgrate", RateMbit: rateMbit})
	bulkPort, pacedPort := uniquePort(), uniquePort()
	rec := startRecording(t, record.Config{Groups: event.GroupConn | event.GroupRate, Filters: record.Filters{NetNS: lab.Client.NS}})
	// 24 MiB: about a second at the link rate.
	bulkDelivered := sendTCPInfo(t, lab, bulkPort, "--count", "384", "--size", "65536", "--interval", "0")
	// 100 writes of 1000 bytes, one per 5 ms: 1.6 Mbit/s.
	pacedDelivered := sendTCPInfo(t, lab, pacedPort, "--count", "100", "--size", "1000", "--interval", "5ms")
	res := rec.stop(t)
	if res.Events["tcp_rate"] == 0 {
		t.Fatalf("no tcp_rate events (events %v)", res.Events)
	}

	byPort := map[uint16]uint64{}
	for _, c := range conns(t, rec.path) {
		byPort[c.Remote.Port()] = c.ID
	}
	samples := map[uint64][]rateSample{}
	eachRecord(t, rec.path, func(rc trace.Record) {
		if rc.Type.Name != "tcp_rate" {
			return
		}
		u := func(name string) uint64 {
			v, ok := rc.Uint(name)
			if !ok {
				t.Fatalf("tcp_rate lacks %s", name)
			}
			return v
		}
		samples[rc.Conn()] = append(samples[rc.Conn()], rateSample{
			timeNs: rc.Time(), ackNs: u("ack_ns"), newly: rc.Size(), same: rc.Flags()&1 != 0,
			delivered: u("delivered"), lost: u("lost"), rateDelivered: u("rate_delivered"),
			intervalUs: u("rate_interval_us"), mss: u("mss"), appLimited: u("app_limited") != 0,
		})
	})

	check := func(name string, port int, tcpiDelivered uint64) []rateSample {
		t.Helper()
		id, ok := byPort[uint16(port)]
		if !ok {
			t.Fatalf("%s: no connection to port %d in the trace", name, port)
		}
		ss := samples[id]
		if len(ss) < 10 {
			t.Fatalf("%s: %d tcp_rate events, want many", name, len(ss))
		}
		for i, s := range ss {
			if i > 0 {
				prev := ss[i-1]
				if s.delivered <= prev.delivered {
					t.Fatalf("%s: tcp_rate %d: delivered %d after %d, want strictly increasing", name, i, s.delivered, prev.delivered)
				}
				if int64(s.newly) != int64(s.delivered-prev.delivered) {
					t.Errorf("%s: tcp_rate %d: size %d, want the %d segments newly delivered", name, i, s.newly, s.delivered-prev.delivered)
				}
			}
			// The sample is read after the ACK that made it.
			if s.ackNs > s.timeNs || s.timeNs-s.ackNs > 5e9 {
				t.Errorf("%s: tcp_rate %d at %d for an ACK at %d", name, i, s.timeNs, s.ackNs)
			}
		}
		if last := ss[len(ss)-1]; last.delivered != tcpiDelivered {
			t.Errorf("%s: last tcp_rate says %d delivered, TCP_INFO %d", name, last.delivered, tcpiDelivered)
		}
		return ss
	}

	bulk := check("bulk", bulkPort, bulkDelivered)
	var rates []float64
	same := 0
	for _, s := range bulk {
		if s.same {
			same++
		}
		if !s.appLimited && !s.same && s.intervalUs > 0 {
			rates = append(rates, s.bps())
		}
	}
	if len(rates) < len(bulk)/4 {
		t.Fatalf("bulk: %d of %d samples usable (not app-limited, not repeated)", len(rates), len(bulk))
	}
	if testing.Verbose() {
		for i, s := range bulk {
			if s.intervalUs > 0 && s.bps() > rateMbit*1e6 {
				t.Logf("above: #%d t+%.3fms delivered %d lost %d rate %d segs / %d us (%.0f Mbit/s) app %v same %v", i, float64(s.timeNs-bulk[0].timeNs)/1e6, s.delivered, s.lost, s.rateDelivered, s.intervalUs, s.bps()/1e6, s.appLimited, s.same)
			}
		}
	}
	slices.Sort(rates)
	median, top := rates[len(rates)/2], rates[len(rates)-1]
	above := len(rates) - sortSearch(rates, rateMbit*1e6)
	t.Logf("bulk: %d tcp_rate (%d repeats), %d usable: median %.1f Mbit/s, max %.1f, %d above the tbf rate; tcpi_delivered %d",
		len(bulk), same, len(rates), median/1e6, top/1e6, above, bulkDelivered)
	// Payload (mss) over a tbf that counts whole frames: a little below the
	// link rate; a sample is a few ms long, so a generous band.
	if median < 0.6*rateMbit*1e6 || median > 1.1*rateMbit*1e6 {
		t.Errorf("bulk: median delivery rate %.1f Mbit/s, want near the %d Mbit/s link", median/1e6, rateMbit)
	}

	paced := check("paced", pacedPort, pacedDelivered)
	limited := 0
	for _, s := range paced {
		if s.appLimited {
			limited++
		}
	}
	t.Logf("paced: %d tcp_rate, %d app-limited; tcpi_delivered %d", len(paced), limited, pacedDelivered)
	if limited < len(paced)*9/10 {
		t.Errorf("paced: %d of %d samples app-limited, want (nearly) all", limited, len(paced))
	}
}

// sortSearch returns the index of the first rate above v in sorted rates.
func sortSearch(rates []float64, v float64) int {
	i, _ := slices.BinarySearch(rates, v)
	for i < len(rates) && rates[i] <= v {
		i++
	}
	return i
}
