// SPDX-License-Identifier: Apache-2.0

package export

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/magnet-tracer/magnet/internal/trace"
)

// pcapng block types and options (draft-ietf-opsawg-pcapng).
const (
	pcapngSHB       = 0x0A0D0D0A
	pcapngIDB       = 0x00000001
	pcapngEPB       = 0x00000006
	pcapngByteOrder = 0x1A2B3C4D
	linkEthernet    = 1
	optComment      = 1
	optIfName       = 2
	optIfDesc       = 3
	optIfTsresol    = 9
	optShbUserAppl  = 4
	optEpbFlags     = 2
)

// WritePcapng writes the packets traces recorded with the headers group as
// pcapng, which Wireshark and tshark open: one interface per (trace,
// network namespace, ifindex), described before its first packet;
// nanosecond wall-clock timestamps; the direction in epb_flags; and a
// comment naming the connection and the task current when the packet
// passed the device. Several traces are merged in time order as mergecap
// does, by a Merge (the same timeline as the other exports). It returns
// how many packets it wrote and how many of them came out of time order
// (further out of order in their trace than the window).
func WritePcapng(out io.Writer, sources []TableSource) (n int, late uint64, err error) {
	w := bufio.NewWriterSize(out, 256<<10)
	pw := &pcapngWriter{w: w, ifaces: map[ifaceKey]uint32{}}
	if err := pw.block(pcapngSHB, func(b []byte) []byte {
		b = binary.LittleEndian.AppendUint32(b, pcapngByteOrder)
		b = binary.LittleEndian.AppendUint16(b, 1) // version 1.0
		b = binary.LittleEndian.AppendUint16(b, 0)
		b = binary.LittleEndian.AppendUint64(b, ^uint64(0)) // section length unknown
		b = appendOption(b, optShbUserAppl, []byte("magnet"))
		return appendOption(b, 0, nil)
	}); err != nil {
		return 0, 0, err
	}
	var lastType *trace.EventType
	var lastPacket bool
	m := NewMerge(sources, MergeOptions{Keep: func(_ int, rec trace.Record) bool {
		if rec.Type != lastType {
			lastType, lastPacket = rec.Type, rec.Type.Name == "headers"
		}
		return lastPacket
	}})
	for {
		h, err := m.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			if ferr := w.Flush(); err == nil {
				err = ferr
			}
			return n, m.Late(), err
		}
		n++
		if err := pw.packet(h.Source, sources[h.Source].Name, h); err != nil {
			return n, m.Late(), err
		}
	}
}

type ifaceKey struct {
	source  int
	netns   uint32
	ifindex uint64
}

type pcapngWriter struct {
	w      *bufio.Writer
	ifaces map[ifaceKey]uint32
	buf    []byte
}

// block writes one block: type, total length, body (padded to 4), length.
func (p *pcapngWriter) block(typ uint32, body func([]byte) []byte) error {
	b := p.buf[:0]
	b = binary.LittleEndian.AppendUint32(b, typ)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = body(b)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	total := uint32(len(b) + 4)
	binary.LittleEndian.PutUint32(b[4:], total)
	b = binary.LittleEndian.AppendUint32(b, total)
	p.buf = b
	_, err := p.w.Write(b)
	return err
}

func appendOption(b []byte, code uint16, val []byte) []byte {
	b = binary.LittleEndian.AppendUint16(b, code)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(val)))
	b = append(b, val...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func (p *pcapngWriter) iface(si int, name string, rs *Resolver, netns uint32, ifindex uint64) (uint32, error) {
	k := ifaceKey{si, netns, ifindex}
	if id, ok := p.ifaces[k]; ok {
		return id, nil
	}
	id := uint32(len(p.ifaces))
	p.ifaces[k] = id
	ifname := rs.ifaces[uint64(netns)<<32|ifindex]
	if ifname == "" {
		ifname = fmt.Sprintf("if%d", ifindex)
	}
	err := p.block(pcapngIDB, func(b []byte) []byte {
		b = binary.LittleEndian.AppendUint16(b, linkEthernet)
		b = binary.LittleEndian.AppendUint16(b, 0)
		b = binary.LittleEndian.AppendUint32(b, 0) // snaplen: no limit declared
		b = appendOption(b, optIfName, []byte(ifname))
		b = appendOption(b, optIfDesc, []byte(fmt.Sprintf("%s netns %d ifindex %d", name, netns, ifindex)))
		b = appendOption(b, optIfTsresol, []byte{9}) // nanoseconds
		return appendOption(b, 0, nil)
	})
	return id, err
}

func (p *pcapngWriter) packet(si int, name string, h *Held) error {
	rec, rs := h.Rec, h.Resolver
	ifindex, _ := rec.Uint("ifindex")
	caplen, _ := rec.Uint("caplen")
	dir, _ := rec.Uint("dir")
	data, _ := rec.Bytes("data")
	if caplen > uint64(len(data)) {
		caplen = uint64(len(data))
	}
	id, err := p.iface(si, name, rs, rec.NetNS(), ifindex)
	if err != nil {
		return err
	}
	ts := uint64(h.Wall)
	pid, comm, _ := h.Task()
	comment := fmt.Sprintf("magnet %s conn=%d pid=%d tid=%d comm=%s cpu=%d", directionName(dir), rec.Conn(), pid, rec.TID(), comm, rec.CPU())
	orig := uint32(rec.Size())
	if orig < uint32(caplen) {
		orig = uint32(caplen)
	}
	return p.block(pcapngEPB, func(b []byte) []byte {
		b = binary.LittleEndian.AppendUint32(b, id)
		b = binary.LittleEndian.AppendUint32(b, uint32(ts>>32))
		b = binary.LittleEndian.AppendUint32(b, uint32(ts))
		b = binary.LittleEndian.AppendUint32(b, uint32(caplen))
		b = binary.LittleEndian.AppendUint32(b, orig)
		b = append(b, data[:caplen]...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
		flags := uint32(2) // outbound
		if dir == 1 {
			flags = 1 // inbound
		}
		b = appendOption(b, optEpbFlags, binary.LittleEndian.AppendUint32(nil, flags))
		b = appendOption(b, optComment, []byte(comment))
		return appendOption(b, 0, nil)
	})
}

func directionName(dir uint64) string {
	if dir == 1 {
		return "ingress"
	}
	return "egress"
}
