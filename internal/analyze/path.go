// SPDX-License-Identifier: Apache-2.0

package analyze

// Following a segment from one end of a connection to the other. The
// sender's hop tracker hands every packet it passes to its device (dev_xmit)
// to the connection's pathStats as a departure; the receiver's tracker looks
// each packet reaching its IP layer up among its peer's departures: by IPv4
// id, which TCP gives each packet from a per-socket counter (a GSO packet of
// n segments takes n ids, so a receiver's packet may start inside one), or,
// without ids (IPv6), by the TCP sequence number of the first byte. From
// there the receiver's tracker follows the segment up to the application and
// hands the whole journey back here.

// maxWireNs is how long a departure waits for its arrival before it is
// given up on: longer than any queue on a path.
const maxWireNs = 10e9

// departure is a packet that left one end's device.
type departure struct {
	times    [4]uint64 // tcp_xmit, ip_send, dev_queue (if viaQueue), dev_xmit
	viaQueue bool      // it passed a qdisc: dev_queue
	noIP     bool      // the sender's trace has no IP layer: times[1] is times[0]
	seg      uint64
	seq      uint32
	size     int32 // TCP payload: 0 for a pure ACK, which no reader takes
	gso      uint16
	st       [jDevRecv]stamp // the sender's events
}

// pathSeg is a received segment matched to its departure, on its way up.
type pathSeg struct {
	// tcp_xmit, ip_send, dev_queue (if viaQueue), dev_xmit, dev_recv,
	// ip_recv, tcp_rcv, sock_recv
	times    [8]uint64
	viaQueue bool
	// noIP, noIPr: the sender's, the receiver's trace has no IP layer
	// (times[1] is times[0], times[5] is times[4])
	noIP, noIPr bool
	seg         uint64 // the receiver's number for it
	from        *pathStats
	// what the sender sent (seq, TCP payload, GSO segments: of the whole
	// packet it left in) and the receiver got (IPv4 id, IP length)
	seq   uint32
	size  int32
	gso   uint16
	ipid  uint16
	hasID bool
	ipLen int32
	st    [numJourneyLayers]stamp // each layer's event
}

// pathStats follows the segments one connection end sends to its peer.
type pathStats struct {
	cs        *connState
	sameClock bool
	byID      map[uint16]departure
	bySeq     map[uint32]departure
	sinceSwep int
	// departed: packets handed to the device; matched: found at the peer;
	// completed: followed to the peer's application.
	departed, matched, completed uint64
	departedData                 uint64 // departed with data
	unmatched                    uint64 // peer's packets with no departure here
	lostOnTheWay                 uint64 // matched, but never read as such
	hops                         [numHops]Dist
	e2e                          Dist
}

func newPathStats(cs *connState, sameClock bool) *pathStats {
	return &pathStats{cs: cs, sameClock: sameClock, byID: map[uint16]departure{}, bySeq: map[uint32]departure{}}
}

// depart takes a packet handed to the device; noIP: the sender's trace has
// no IP layer.
func (ps *pathStats) depart(p *pending, noIP bool) {
	d := departure{times: [4]uint64{p.times[0], p.times[1], p.times[2], p.t}, viaQueue: p.viaQueue, noIP: noIP,
		seg: p.seg, seq: p.seq, size: p.size, gso: max(p.gso, 1)}
	copy(d.st[:], p.st[:jDevRecv])
	ps.departed++
	if p.size > 0 {
		ps.departedData++
	}
	if p.hasID {
		ps.byID[p.ipid] = d
	} else if p.size > 0 {
		ps.bySeq[p.seq] = d
	}
	if ps.sinceSwep++; ps.sinceSwep >= 4096 {
		ps.sweep(p.t)
	}
}

// sweep forgets departures that will not arrive any more.
func (ps *pathStats) sweep(now uint64) {
	ps.sinceSwep = 0
	for k, d := range ps.byID {
		if d.times[3]+maxWireNs < now {
			delete(ps.byID, k)
		}
	}
	for k, d := range ps.bySeq {
		if d.times[3]+maxWireNs < now {
			delete(ps.bySeq, k)
		}
	}
}

// plausible: a departure that can be this arrival's, given when each was.
// On one clock nothing arrives before it left; across machines the clocks
// may disagree, so only the age is checked.
func (ps *pathStats) plausible(d departure, arrived uint64) bool {
	left := d.times[3]
	if arrived < left {
		return !ps.sameClock && left-arrived < maxWireNs
	}
	return arrived-left < maxWireNs
}

// takeID finds the departure of the packet with IPv4 id id.
func (ps *pathStats) takeID(id uint16, arrived uint64) (departure, bool) {
	if d, ok := ps.byID[id]; ok && ps.plausible(d, arrived) {
		delete(ps.byID, id)
		ps.matched++
		return d, true
	}
	// Segmented on the way (TSO, a qdisc) and coalesced again (GRO): the
	// packet starts inside a departed GSO packet, which stays for the rest.
	for back := uint16(1); back < 64; back++ {
		if d, ok := ps.byID[id-back]; ok && back < d.gso && ps.plausible(d, arrived) {
			ps.matched++
			return d, true
		}
	}
	return departure{}, false
}

// takeSeq finds the departure of the data segment starting at seq.
func (ps *pathStats) takeSeq(seq uint32, arrived uint64) (departure, bool) {
	if d, ok := ps.bySeq[seq]; ok && ps.plausible(d, arrived) {
		delete(ps.bySeq, seq)
		ps.matched++
		return d, true
	}
	return departure{}, false
}

// takeSeqFits is takeSeq for an arrival of IP length ipLen: the
// departure's data and the IP and TCP headers make that length, or the
// arrival is longer than any headers (it holds data) and holds no more
// than the departure's (a qdisc on the way segmented a GSO packet: the
// arrival is its first segment).
func (ps *pathStats) takeSeqFits(seq uint32, ipLen int32, arrived uint64) (departure, bool) {
	if d, ok := ps.bySeq[seq]; ok {
		if hdr := ipLen - d.size; hdr > maxHeaders || hdr < minHeaders && ipLen <= maxHeaders {
			return departure{}, false
		}
	}
	return ps.takeSeq(seq, arrived)
}

// complete takes a segment followed from the sender's TCP to the receiver's
// application. Each time is taken as no earlier than the one before, so
// that the hops, all non-negative, add up to the whole journey; on two
// machines' clocks only the wire can be what this moves.
func (ps *pathStats) complete(s *pathSeg) {
	t := s.times
	queued := s.viaQueue
	if !queued {
		t[2] = t[1]
	}
	for i := 1; i < len(t); i++ {
		t[i] = max(t[i], t[i-1])
	}
	for i := range ps.hops {
		if (i == hopIPXmit || i == hopXmitDev) && queued || (i == hopIPQueue || i == hopQueueXmit || i == hopXmitQueue) && !queued {
			continue // the other way past the device
		}
		down := i < hopWire
		if noIP := s.noIP && down || s.noIPr && !down; ipHop[i] == 1 && noIP || ipHop[i] == -1 && !noIP {
			continue // the other way past IP: through it, or with no IP layer recorded
		}
		ps.hops[i].Add(float64(t[hopSpan[i][1]]-t[hopSpan[i][0]]) / 1e3)
	}
	ps.e2e.Add(float64(t[7]-t[0]) / 1e3)
	if p := ps.cs.plot; p != nil {
		p.path = append(p.path, pathPoint{read: t[7], total: t[7] - t[0], receiver: t[7] - t[4]})
	}
	ps.completed++
}

// Path is where the time of the segments one connection end sent went,
// from its TCP to the peer's application, across the wire.
type Path struct {
	Peer      uint64 `json:"peer"`
	PeerTrace string `json:"peer_trace,omitempty"` // when the peer is in another trace
	// SameClock: both ends were stamped by one clock (one machine). When
	// false the traces were aligned by their wall clocks and the wire hop
	// is off by the machines' clock difference.
	SameClock bool `json:"same_clock"`
	// Departed: packets handed to this end's device; Matched: found at the
	// peer's IP layer; Segments: followed to the peer's application, which
	// the hops and EndToEnd describe.
	Departed uint64 `json:"departed"`
	Matched  uint64 `json:"matched"`
	// DataDeparted: departed packets with data, the ones a reader takes.
	DataDeparted uint64      `json:"data_departed"`
	Segments     uint64      `json:"segments"`
	Hops         []*HopStats `json:"hops"`
	EndToEnd     HopStats    `json:"end_to_end"`
}

func (ps *pathStats) report() *Path {
	if ps.departedData == 0 {
		return nil // pure ACKs only: nothing reaches the peer's reader
	}
	p := &Path{Peer: ps.cs.peer.id, SameClock: ps.sameClock, Departed: ps.departed, Matched: ps.matched,
		DataDeparted: ps.departedData, Segments: ps.completed}
	if ps.cs.peer.src != ps.cs.src {
		p.PeerTrace = ps.cs.conn.PeerTrace
	}
	for i := range ps.hops {
		// A hop no segment took (dev_queue on a device without a qdisc)
		// is left out, not shown as zero.
		if ps.hops[i].N > 0 {
			p.Hops = append(p.Hops, &HopStats{Hop: hopNames[i], Count: ps.hops[i].N, Delay: summarise(&ps.hops[i]), d: ps.hops[i]})
		}
	}
	p.EndToEnd = HopStats{Hop: "tcp_xmit→sock_recv", Count: ps.e2e.N, Delay: summarise(&ps.e2e), d: ps.e2e}
	return p
}
