// SPDX-License-Identifier: Apache-2.0

// Package sendbuf follows a TCP connection's send-buffer occupancy from the
// events magnet records: bytes the application has written minus bytes the
// peer has acknowledged (MAGNeT Fig. 13). The trace analysis (`magnet
// report`, `plot sendbuf`) and the daemon's live figures share it.
package sendbuf

// Tracker follows one connection. The zero Tracker is ready; it knows the
// occupancy once it has seen the connection's SYN, which fixes where the
// sequence numbers of the data start.
type Tracker struct {
	written    int64 // bytes known written: max(sends returned, data sent)
	appWritten int64
	acked      int64
	isn        uint32
	haveISN    bool
	accepted   bool
	active     bool // the SYN seen was its own: it connected
}

// Accepted says the connection was first seen as its handshake completed,
// an accepted one (conn_open in state SYN_RECV). Its SYN-ACK went out from
// the listener's request socket, where tcp_xmit does not fire, so no SYN
// tells where its data starts; but it has sent nothing since, and TCP
// sends in order: the first segment it sends starts its data, and until
// then the peer acknowledges up to there (the handshake's last ACK, and
// the request that follows it). The first of these fixes the start.
func (t *Tracker) Accepted() { t.accepted = true }

// Known reports whether the SYN was seen, so that Occupancy means something.
func (t *Tracker) Known() bool { return t.haveISN }

// Occupancy returns the bytes written and not yet acknowledged.
func (t *Tracker) Occupancy() int64 {
	return max(t.written-t.acked, 0)
}

// AppWrote takes a send call that returned n > 0 bytes (sock_send) and
// reports whether the bytes known written grew.
func (t *Tracker) AppWrote(n int64) bool {
	if n <= 0 {
		return false
	}
	t.appWritten += n
	if t.appWritten > t.written {
		t.written = t.appWritten
		return true
	}
	return false
}

// Sent takes a segment TCP transmitted (tcp_xmit: its first sequence
// number, payload bytes, and whether it is a SYN) and reports whether the
// bytes known written grew. sock_send is reported when the call returns,
// often after TCP sent (and the peer acknowledged) its data: what TCP has
// sent is a lower bound of what the application has written.
func (t *Tracker) Sent(seq uint32, size int64, syn bool) bool {
	switch {
	case t.haveISN:
	case syn: // data starts after the SYN
		t.isn, t.haveISN, t.active = seq+1, true, true
	case t.accepted:
		t.isn, t.haveISN = seq, true
	}
	if !t.haveISN || size <= 0 {
		return false
	}
	if hi := t.unwrap(seq, t.written) + size; hi > t.written {
		t.written = hi
		return true
	}
	return false
}

// unwrap places a 32-bit sequence number in the connection's 64-bit byte
// stream (offset from the first data byte), as the position nearest ref:
// TCP never has more than 2^31 bytes between what it sends or
// acknowledges and what it sent or acknowledged before, so a transfer of
// more than 4 GiB keeps counting instead of wrapping.
func (t *Tracker) unwrap(seq uint32, ref int64) int64 {
	return ref + int64(int32(seq-t.isn-uint32(ref)))
}

// Acknowledges says whether a segment from the peer with these TCP flags
// (tcp_rcv's) acknowledges data up to its acknowledgment number: one with
// ACK set, unless it is a reset. A reset carries the peer's rcv_nxt, all
// it received, acknowledged or not (a receiver that closes with unread
// data sends one), and the kernel takes no acknowledgment from it.
func Acknowledges(tcpFlags uint8) bool {
	const ack, rst = 0x10, 0x04
	return tcpFlags&ack != 0 && tcpFlags&rst == 0
}

// Acked takes the acknowledgment number of a segment from the peer that
// Acknowledges (tcp_rcv) and reports whether more was acknowledged.
func (t *Tracker) Acked(ack uint32) bool {
	if !t.haveISN {
		if !t.accepted {
			return false
		}
		t.isn, t.haveISN = ack, true
	}
	if a := t.unwrap(ack, t.acked); a > t.acked {
		t.acked = a
		return true
	}
	return false
}

// AckedBytes takes the count of bytes the peer acknowledged over the
// connection's life (tcpi_bytes_acked, which conn_close carries) and
// reports whether more was acknowledged. ACKs that reach a connection
// after the application closed it go through a kernel path where tcp_rcv
// does not fire, so this is how they count. The kernel counts from
// snd_una at the start, which for a connection that sent its SYN itself
// is the SYN: its count is the data acknowledged plus 1 (an accepted
// connection starts at snd_una = its ISN + 1).
func (t *Tracker) AckedBytes(n int64) bool {
	if t.active {
		n--
	}
	if !t.haveISN || n <= t.acked {
		return false
	}
	t.acked = n
	return true
}
