// SPDX-License-Identifier: Apache-2.0

package analyze

import "github.com/magnet-tracer/magnet/internal/sendbuf"

// SendBuffer is the send-buffer occupancy of a connection over time: bytes
// the application has written minus bytes the peer has acknowledged
// (MAGNeT Fig. 13), sampled at every send and every ACK.
type SendBuffer struct {
	Samples uint64  `json:"samples"`
	Max     int64   `json:"max_bytes"`
	Mean    float64 `json:"mean_bytes"` // time-weighted
	Median  float64 `json:"median_bytes"`
	P99     float64 `json:"p99_bytes"`
	Final   int64   `json:"final_bytes"` // 0 when everything written was acknowledged
	Min     int64   `json:"min_bytes"`
}

// Throughput is a connection's rate at the application and at the wire,
// computed both ways MAGNeT's users met: as FTP does (first to last byte)
// and as magnetd did (open to close), in bits per second.
type Throughput struct {
	AppBytes      int64   `json:"app_bytes"`
	WireBytes     int64   `json:"wire_bytes"`
	AppFirstLast  float64 `json:"app_bps_first_to_last"`
	WireFirstLast float64 `json:"wire_bps_first_to_last"`
	AppOpenClose  float64 `json:"app_bps_open_to_close,omitempty"`
	WireOpenClose float64 `json:"wire_bps_open_to_close,omitempty"`
}

// TCPStats summarises tcp_state snapshots and retransmissions.
type TCPStats struct {
	Snapshots    uint64  `json:"snapshots"`
	CwndMean     float64 `json:"cwnd_mean"`
	CwndMax      float64 `json:"cwnd_max"`
	SrttMeanUs   float64 `json:"srtt_mean_us"`
	SrttMaxUs    float64 `json:"srtt_max_us"`
	SsthreshLast uint64  `json:"ssthresh_last"`
	// RetransSegs counts segments, as the kernel does (tcpi_total_retrans,
	// TcpRetransSegs): a retransmitted skb of n GSO segments is n.
	RetransSegs   uint64 `json:"retransmitted_segments"`
	RetransBytes  int64  `json:"retransmitted_bytes"`
	RetransEvents uint64 `json:"tcp_retrans_events"`
	// KernelRetransSegs is the kernel's own count for the connection
	// (tcpi_total_retrans) at its last tcp_state snapshot or its close;
	// haveKernelRetrans says whether one was seen.
	KernelRetransSegs uint64 `json:"kernel_total_retrans,omitempty"`
	// What TCP transmitted, split: DataBytes of payload in all; of which
	// LocalResendBytes re-sent after a drop on this host (the qdisc refused
	// the first try, so TCP sent the same bytes again without counting a
	// retransmission); WireBytes = DataBytes - LocalResendBytes, what left
	// the host (a locally dropped try never did). RetransBytes above are
	// network retransmissions only.
	DataBytes         int64  `json:"data_bytes"`
	WireBytes         int64  `json:"wire_bytes"`
	LocalResendBytes  int64  `json:"local_resend_bytes"`
	LocalResendEvents uint64 `json:"local_resend_events"`
	// LocalDropBytes is the payload of the connection's packets whose drop
	// on the way down (a drop event) was matched to their tcp_xmit, in
	// LocalDropPackets packets: retransmissions included, which a re-send
	// does not reveal. WireBytes takes off the larger of the two.
	LocalDropBytes    int64  `json:"local_drop_bytes"`
	LocalDropPackets  uint64 `json:"local_drop_packets"`
	cwnd, srtt        Dist
	haveSsthresh      bool
	ssthreshLatest    uint64
	haveKernelRetrans bool
	hiSeq             uint32 // past the highest byte sent (haveHi: any)
	haveHi            bool
}

// connDetail follows one connection through the trace.
type connDetail struct {
	// send buffer
	sbuf         sendbuf.Tracker
	lastSample   uint64
	lastOcc      int64
	occ          Dist
	weighted     float64
	span         uint64
	sb           SendBuffer
	sbStarted    bool
	appFirst     uint64
	appLast      uint64
	wireFirst    uint64
	wireLast     uint64
	tp           Throughput
	tcp          TCPStats
	drops        map[string]uint64
	appIsRecv    bool
	haveAppBytes bool
	// haveSndUna: the trace's tcp_state has snd_una
	haveSndUna bool
	// For plots: occupancy samples (s since start, bytes), when set.
	start             uint64
	sbTrace, sbTraceY *[]float64
}

func newConnDetail(dec *decoder) *connDetail {
	return &connDetail{drops: map[string]uint64{}, haveSndUna: dec.d[kTCPState].size > 0}
}

// observe takes one event of the connection, in time order. Drops are
// counted as they are read (stream.takeDrop).
func (d *connDetail) observe(e *ev) {
	t := e.t
	size := int64(e.size)
	switch e.kind {
	case kSockSend:
		if size > 0 {
			if d.sbuf.AppWrote(size) {
				d.sample(t)
			}
			d.app(t, size, false)
		}
	case kSockRecv:
		if size > 0 {
			d.app(t, size, true)
		}
	case kTCPXmit:
		d.xmit(e, size)
		if d.sbuf.Sent(e.a, size, e.flags&0x02 != 0) {
			d.sample(t)
		}
	case kTCPRcv:
		if sendbuf.Acknowledges(e.flags) && d.sbuf.Acked(e.b) {
			d.sample(t)
		}
	case kTCPState:
		// snd_una: the ACKs a closing connection receives go through a
		// kernel path where tcp_rcv does not fire, but a snapshot there
		// (at close) still says how far they acknowledged.
		if d.haveSndUna && d.sbuf.Acked(e.d) {
			d.sample(t)
		}
		d.tcp.Snapshots++
		d.tcp.cwnd.Add(float64(e.a))
		d.tcp.srtt.Add(float64(e.b))
		d.tcp.ssthreshLatest, d.tcp.haveSsthresh = uint64(e.c), true
		d.kernelRetrans(e.e)
	case kTCPRetrans:
		d.tcp.RetransEvents++
	case kConnClose:
		// The kernel's count of bytes acknowledged over the connection's
		// life, ACKs after the application's close() included.
		if d.sbuf.AckedBytes(int64(e.b)<<32 | int64(e.c)) {
			d.sample(t)
		}
		d.kernelRetrans(e.a)
	case kDevXmit, kDevRecv:
		d.wire(t, size)
	}
}

// xmit splits a tcp_xmit's payload into network retransmissions and
// re-sends after a local drop. The kernel marks a segment that starts
// below snd_nxt as a retransmission (retrans 1). A first transmission the
// qdisc dropped does not advance snd_nxt, so TCP sends the same bytes again
// unmarked: bytes below the highest already sent, on a segment not marked,
// are such a re-send. A recorder that marks them itself writes retrans 2.
func (d *connDetail) xmit(e *ev, size int64) {
	if size <= 0 {
		return
	}
	d.tcp.DataBytes += size
	end := e.a + uint32(size)
	var resent int64
	switch {
	case e.c == 1:
		d.tcp.RetransSegs += uint64(max(e.b, 1))
		d.tcp.RetransBytes += size
	case e.c >= 2:
		resent = size
	case d.tcp.haveHi && int32(d.tcp.hiSeq-e.a) > 0:
		resent = min(size, int64(int32(d.tcp.hiSeq-e.a)))
	}
	if resent > 0 {
		d.tcp.LocalResendBytes += resent
		d.tcp.LocalResendEvents++
	}
	d.tcp.WireBytes = d.tcp.DataBytes - d.tcp.LocalResendBytes
	if !d.tcp.haveHi || int32(end-d.tcp.hiSeq) > 0 {
		d.tcp.hiSeq, d.tcp.haveHi = end, true
	}
}

// localDrops takes the payload the hop tracker saw dropped on the way
// down. Both it and the bytes re-sent after a local drop count tries that
// never left the host, each perhaps short of all of them (a drop not
// recorded; a dropped retransmission, re-sent marked as one): what left
// is the payload less the larger.
func (s *TCPStats) localDrops(bytes int64, packets uint64) {
	s.LocalDropBytes, s.LocalDropPackets = bytes, packets
	s.WireBytes = s.DataBytes - max(s.LocalResendBytes, s.LocalDropBytes)
}

// kernelRetrans takes the kernel's count of the connection's retransmitted
// segments, which only grows.
func (d *connDetail) kernelRetrans(n uint32) {
	d.tcp.KernelRetransSegs = max(d.tcp.KernelRetransSegs, uint64(n))
	d.tcp.haveKernelRetrans = true
}

func (d *connDetail) sample(t uint64) {
	occ := d.sbuf.Occupancy()
	if d.sbStarted && t > d.lastSample {
		d.weighted += float64(d.lastOcc) * float64(t-d.lastSample)
		d.span += t - d.lastSample
	}
	if !d.sbStarted || occ < d.sb.Min {
		d.sb.Min = occ
	}
	if occ > d.sb.Max {
		d.sb.Max = occ
	}
	d.sbStarted = true
	d.lastSample, d.lastOcc = t, occ
	d.sb.Samples++
	d.occ.Add(float64(occ))
	if d.sbTrace != nil {
		*d.sbTrace = append(*d.sbTrace, float64(int64(t)-int64(d.start))/1e9)
		*d.sbTraceY = append(*d.sbTraceY, float64(occ))
	}
}

func (d *connDetail) app(t uint64, size int64, recv bool) {
	// A connection's application rate is that of its first data direction:
	// what a sender sent, or what a receiver read.
	if !d.haveAppBytes {
		d.appFirst, d.appIsRecv, d.haveAppBytes = t, recv, true
	}
	if recv != d.appIsRecv {
		return
	}
	d.tp.AppBytes += size
	d.appLast = t
}

func (d *connDetail) wire(t uint64, size int64) {
	if d.tp.WireBytes == 0 {
		d.wireFirst = t
	}
	d.tp.WireBytes += size
	d.wireLast = t
}

// finish computes the summaries; open and close are the connection's
// lifetime (close 0 when it did not end in the trace).
func (d *connDetail) finish(open, close uint64) {
	if d.sbStarted {
		d.sb.Final = d.lastOcc
		if d.span > 0 {
			d.sb.Mean = d.weighted / float64(d.span)
		} else {
			d.sb.Mean = float64(d.lastOcc)
		}
		d.sb.Median = d.occ.Quantile(0.5)
		d.sb.P99 = d.occ.Quantile(0.99)
	}
	rate := func(bytes int64, from, to uint64) float64 {
		if to <= from || bytes == 0 {
			return 0
		}
		return float64(bytes) * 8 / (float64(to-from) / 1e9)
	}
	d.tp.AppFirstLast = rate(d.tp.AppBytes, d.appFirst, d.appLast)
	d.tp.WireFirstLast = rate(d.tp.WireBytes, d.wireFirst, d.wireLast)
	if close > open {
		d.tp.AppOpenClose = rate(d.tp.AppBytes, open, close)
		d.tp.WireOpenClose = rate(d.tp.WireBytes, open, close)
	}
	d.tcp.CwndMean, d.tcp.CwndMax = d.tcp.cwnd.Mean(), d.tcp.cwnd.Max
	d.tcp.SrttMeanUs, d.tcp.SrttMaxUs = d.tcp.srtt.Mean(), d.tcp.srtt.Max
	d.tcp.SsthreshLast = d.tcp.ssthreshLatest
}
