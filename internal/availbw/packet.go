// SPDX-License-Identifier: Apache-2.0

package availbw

import (
	"encoding/binary"
	"errors"
)

// Sizes of probe packets. Sizes are of the IP packet: UDP payload plus
// the 8-byte UDP header and the 20-byte IPv4 (40-byte IPv6) header.
const (
	ipUDPHeaders  = 28
	ip6UDPHeaders = 48
	// MinPacketSize is the smallest probe packet.
	MinPacketSize = 100
	// MaxPacketSize is the largest: a full 1500-byte Ethernet payload, so
	// that no probe packet is ever fragmented on a common path.
	MaxPacketSize = 1500
	// MaxStreamPackets bounds the length of one stream.
	MaxStreamPackets = 1000
)

// probeMagic starts every probe packet.
var probeMagic = [4]byte{'M', 'G', 'B', 'P'}

// probeHeaderLen is the size of the probe header at the start of the UDP
// payload: magic, session, stream id, sequence number, send time.
const probeHeaderLen = 4 + 8 + 4 + 4 + 8

// probeHeader is what each probe packet carries, big-endian.
type probeHeader struct {
	Session uint64
	Stream  uint32
	Seq     uint32
	SentNs  int64 // the sender's clock (CLOCK_REALTIME) just before sending
}

// put writes h at the start of b, which must hold probeHeaderLen bytes.
func (h probeHeader) put(b []byte) {
	copy(b, probeMagic[:])
	binary.BigEndian.PutUint64(b[4:], h.Session)
	binary.BigEndian.PutUint32(b[12:], h.Stream)
	binary.BigEndian.PutUint32(b[16:], h.Seq)
	binary.BigEndian.PutUint64(b[20:], uint64(h.SentNs))
}

// errNotProbe is returned for a datagram that is not a probe packet.
var errNotProbe = errors.New("not a probe packet")

// parseProbe reads the header of a received datagram.
func parseProbe(b []byte) (probeHeader, error) {
	if len(b) < probeHeaderLen || [4]byte(b[:4]) != probeMagic {
		return probeHeader{}, errNotProbe
	}
	return probeHeader{
		Session: binary.BigEndian.Uint64(b[4:]),
		Stream:  binary.BigEndian.Uint32(b[12:]),
		Seq:     binary.BigEndian.Uint32(b[16:]),
		SentNs:  int64(binary.BigEndian.Uint64(b[20:])),
	}, nil
}
