// SPDX-License-Identifier: Apache-2.0

// Package export turns traces into text and tables: the tab-separated event
// listing of `magnet parse` and the connection table. It resolves what the
// trace stores once (a thread's pid and command, an interface's name, a
// connection's addresses) for every event that refers to it.
package export

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/magnet-tracer/magnet/internal/trace"
)

// Columns are the fixed columns of the text listing, in order; a last
// column, fields, holds the event-specific fields as name=value pairs.
var Columns = []string{"time", "cpu", "pid", "tid", "comm", "netns", "conn", "event", "size", "fields"}

// TimeFormat selects how the time column is written.
type TimeFormat int

const (
	// TimeRelative is seconds since the first record, with nanoseconds.
	TimeRelative TimeFormat = iota
	// TimeAbsolute is wall-clock time, RFC 3339 with nanoseconds, UTC.
	TimeAbsolute
	// TimeRaw is the kernel's CLOCK_MONOTONIC in nanoseconds.
	TimeRaw
)

// ParseTimeFormat parses rel, abs or raw.
func ParseTimeFormat(s string) (TimeFormat, error) {
	switch s {
	case "rel", "relative", "":
		return TimeRelative, nil
	case "abs", "absolute", "wall":
		return TimeAbsolute, nil
	case "raw", "ns":
		return TimeRaw, nil
	}
	return 0, fmt.Errorf("unknown time format %q (want rel, abs or raw)", s)
}

type task struct {
	pid   uint32
	comm  string
	clean string // comm as one text column (sanitize)
}

// Resolver keeps what earlier records said about threads and interfaces.
type Resolver struct {
	fmts [256]*typeFmt // by type id, made at first use
	// the thread of the latest line (nil: not described), whose pid and
	// tid text is kept for its run of events
	lastTID  uint32
	lastTask *task
	lastOK   bool
	// the text of the latest line's pid and tid, namespace, connection and
	// whole seconds (relative time), reused while they repeat
	pidText, tidText []byte
	netns            uint32
	netnsText        []byte
	conn             uint64
	connText         []byte
	sec              int64
	secText          []byte
	hdr              *trace.Header
	tasks            map[uint32]*task // a new one for every task record: held records keep theirs
	ifaces           map[uint64]string
	start            uint64
	started          bool
}

// NewResolver prepares to resolve records of the trace with header h.
func NewResolver(h *trace.Header) *Resolver {
	return &Resolver{hdr: h, tasks: map[uint32]*task{}, ifaces: map[uint64]string{}}
}

// Observe takes note of metadata records (task, iface) and reports whether
// rec is one.
func (rs *Resolver) Observe(rec trace.Record) bool {
	if !rs.started {
		rs.start, rs.started = rec.Time(), true
	}
	switch rec.Type.Name {
	case "task":
		pid, _ := rec.Uint("pid")
		comm, _ := rec.Str("comm")
		rs.tasks[rec.TID()] = &task{uint32(pid), comm, sanitize(comm)}
		if rec.TID() == rs.lastTID {
			rs.lastOK = false // renamed, or its pid changed
		}
		return true
	case "iface":
		idx, _ := rec.Uint("ifindex")
		name, _ := rec.Str("name")
		rs.ifaces[uint64(rec.NetNS())<<32|idx] = name
		return true
	}
	return false
}

// Task returns the pid and command name of thread tid. Thread 0 is each
// CPU's idle task, interrupted by softirq work.
func (rs *Resolver) Task(tid uint32) (uint32, string, bool) {
	if tid == 0 {
		return 0, "swapper", true
	}
	t, ok := rs.tasks[tid]
	if !ok {
		return 0, "", false
	}
	return t.pid, t.comm, true
}

// swapper is thread 0, each CPU's idle task.
var swapper = &task{0, "swapper", "swapper"}

// task returns thread tid as the metadata read so far describe it, or nil.
func (rs *Resolver) task(tid uint32) *task {
	if tid == 0 {
		return swapper
	}
	return rs.tasks[tid]
}

// TextOptions configure WriteText.
type TextOptions struct {
	Time TimeFormat
	// Meta includes the metadata records (task, iface) as lines.
	Meta bool
	// Filter, if set, selects the records to print.
	Filter func(trace.Record) bool
	// FileOrder prints the records as stored, trace after trace, rather
	// than in time order.
	FileOrder bool
}

// WriteText writes the trace read by r as tab-separated text, one event a
// line, after a header line: WriteTexts of one trace. Records further out
// of order than the window are written late, uncounted.
func WriteText(w io.Writer, r *trace.Reader, opts TextOptions) error {
	_, err := WriteTexts(w, []TableSource{{Reader: r}}, opts)
	return err
}

// WriteTexts writes the sources as tab-separated text on one timeline, one
// record a line, after a header line: merged in time order by a Merge
// (unless opts.FileOrder), each line starting with its trace's name when
// there are several. Relative times count from the Merge's start, absolute
// ones are Timeline.Wall; raw ones are each trace's own clock. It returns
// how many records were written out of time order. The first error reading
// a trace comes after every record read before it was written.
func WriteTexts(w io.Writer, sources []TableSource, opts TextOptions) (late uint64, err error) {
	// Lines are appended to one buffer written out when nearly full: a
	// bufio.Writer would copy each line once more.
	const flushAt = 256 << 10
	buf := make([]byte, 0, flushAt+4096)
	named := len(sources) > 1
	if named {
		buf = append(buf, "trace\t"...)
	}
	buf = append(buf, strings.Join(Columns, "\t")+"\n"...)
	flush := func() error {
		_, err := w.Write(buf)
		buf = buf[:0]
		return err
	}
	var keep func(int, trace.Record) bool
	if opts.Filter != nil {
		keep = func(_ int, rec trace.Record) bool { return opts.Filter(rec) }
	}
	m := NewMerge(sources, MergeOptions{Meta: opts.Meta, FileOrder: opts.FileOrder, Keep: keep})
	for {
		h, err := m.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			if ferr := flush(); ferr != nil {
				return m.Late(), ferr
			}
			return m.Late(), err
		}
		if named {
			buf = append(buf, sources[h.Source].Name...)
			buf = append(buf, '\t')
		}
		rs := h.Resolver
		switch opts.Time {
		case TimeRaw:
			buf = appendUint(buf, h.Rec.Time())
		case TimeAbsolute:
			buf = appendWall(buf, h.Wall)
		default:
			buf = rs.appendRel(buf, h.Wall-m.Start())
		}
		buf = rs.appendBody(buf, h.Rec, h.task)
		if len(buf) >= flushAt {
			if err := flush(); err != nil {
				return m.Late(), err
			}
		}
	}
}

// AppendLine appends rec's text line, newline included.
func (rs *Resolver) AppendLine(b []byte, rec trace.Record, tf TimeFormat) []byte {
	b = rs.appendTime(b, rec.Time(), tf)
	return rs.appendBody(b, rec, rs.task(rec.TID()))
}

// appendBody appends the columns after time, newline included, for rec
// whose thread is t (nil when the trace did not describe it).
func (rs *Resolver) appendBody(b []byte, rec trace.Record, t *task) []byte {
	b = append(b, '\t')
	b = appendUint(b, uint64(rec.CPU()))
	b = append(b, '\t')
	fm := rs.formatOf(rec.Type)
	// The thread, namespace and connection of a line mostly repeat the
	// previous line's: their text is kept and reused.
	tid := rec.TID()
	if !rs.lastOK || tid != rs.lastTID || t != rs.lastTask {
		rs.lastTID, rs.lastTask, rs.lastOK = tid, t, true
		if t != nil {
			rs.pidText = appendUint(rs.pidText[:0], uint64(t.pid))
		}
		rs.tidText = appendUint(rs.tidText[:0], uint64(tid))
	}
	ok := t != nil && !fm.lost // lost: counted per CPU, not by a task
	if ok {
		b = append(b, rs.pidText...)
	} else {
		b = append(b, '-')
	}
	b = append(b, '\t')
	b = append(b, rs.tidText...)
	b = append(b, '\t')
	if ok && t.clean != "" {
		b = append(b, t.clean...)
	} else {
		b = append(b, '-')
	}
	b = append(b, '\t')
	if ns := rec.NetNS(); ns != rs.netns || rs.netnsText == nil {
		rs.netns, rs.netnsText = ns, appendUint(rs.netnsText[:0], uint64(ns))
	}
	b = append(b, rs.netnsText...)
	b = append(b, '\t')
	if c := rec.Conn(); c == 0 {
		b = append(b, '-')
	} else {
		if c != rs.conn || rs.connText == nil {
			rs.conn, rs.connText = c, appendUint(rs.connText[:0], c)
		}
		b = append(b, rs.connText...)
	}
	b = append(b, '\t')
	b = append(b, rec.Type.Name...)
	b = append(b, '\t')
	b = appendInt(b, int64(rec.Size()))
	b = append(b, '\t')
	b = rs.appendFields(b, rec, fm)
	return append(b, '\n')
}

func (rs *Resolver) appendTime(b []byte, ns uint64, tf TimeFormat) []byte {
	switch tf {
	case TimeRaw:
		return appendUint(b, ns)
	case TimeAbsolute:
		return appendWall(b, int64(ns)+rs.hdr.Clock.WallOffsetNs)
	}
	return rs.appendRel(b, int64(ns)-int64(rs.start))
}

// appendWall appends wall-clock time wall (ns since the Unix epoch) as RFC
// 3339 UTC with nanoseconds.
func appendWall(b []byte, wall int64) []byte {
	return time.Unix(0, wall).UTC().AppendFormat(b, "2006-01-02T15:04:05.000000000Z")
}

// appendRel appends d ns as seconds with nine decimals.
func (rs *Resolver) appendRel(b []byte, d int64) []byte {
	if d < 0 {
		b = append(b, '-')
		d = -d
	}
	if sec := d / 1e9; sec != rs.sec || rs.secText == nil {
		rs.sec, rs.secText = sec, append(appendInt(rs.secText[:0], sec), '.')
	}
	b = append(b, rs.secText...)
	// Nine digits of nanoseconds, two at a time.
	f := uint64(d % 1e9)
	i := len(b)
	b = append(b, "000000000"...)
	for j := i + 8; j > i; j -= 2 {
		r := f % 100 * 2
		f /= 100
		b[j-1], b[j] = digitPairs[r], digitPairs[r+1]
	}
	b[i] = byte('0' + f)
	return b
}

// fieldClass says how a field is printed.
type fieldClass uint8

const (
	classUint fieldClass = iota
	classInt
	classIP
	classStr
	classBytes
	classEnum
	classIfindex // a number followed by iface=NAME when known
	classLost    // a lost record's per-type count, gathered into types=
)

type fieldFmt struct {
	f     trace.Field
	class fieldClass
	enum  map[uint64]string
	lost  string // classLost: the type name
}

// typeFmt is how records of one type are printed, worked out once.
type typeFmt struct {
	tcp, lost         bool
	family, caplen    trace.Field
	hasFam, hasCaplen bool
	fields            []fieldFmt
}

func (rs *Resolver) formatOf(t *trace.EventType) *typeFmt {
	if tf := rs.fmts[t.ID]; tf != nil {
		return tf
	}
	// kevent_lost counts the losses of kernel events chosen at run time
	// as lost does the built-in ones'.
	tf := &typeFmt{lost: t.Name == "lost" || t.Name == "kevent_lost"}
	switch t.Name {
	case "tcp_xmit", "tcp_rcv", "tcp_retrans":
		tf.tcp = true
	}
	tf.family, tf.hasFam = t.Field("family")
	tf.caplen, tf.hasCaplen = t.Field("caplen")
	tf.hasFam = tf.hasFam && tf.family.Kind != trace.KindInt
	for _, f := range t.Fields {
		ff := fieldFmt{f: f}
		switch {
		case tf.lost && strings.HasPrefix(f.Name, "n_"):
			ff.class, ff.lost = classLost, f.Name[2:]
		case f.Kind == trace.KindIP:
			ff.class = classIP
		case f.Kind == trace.KindStr:
			ff.class = classStr
		case f.Kind == trace.KindBytes:
			ff.class = classBytes
		case f.Enum() != "":
			ff.class = classEnum
			ff.enum = map[uint64]string{}
			for k, name := range rs.hdr.Enums[f.Enum()] {
				if v, err := strconv.ParseUint(k, 10, 64); err == nil {
					ff.enum[v] = name
				}
			}
		case f.Kind == trace.KindInt:
			ff.class = classInt
		case f.Name == "ifindex" && t.Name != "iface":
			ff.class = classIfindex
		}
		tf.fields = append(tf.fields, ff)
	}
	rs.fmts[t.ID] = tf
	return tf
}

// appendFields writes the event-specific fields as name=value, separated by
// spaces; enums by name, addresses as text, interfaces with their names.
func (rs *Resolver) appendFields(b []byte, rec trace.Record, tf *typeFmt) []byte {
	first := true
	sep := func() {
		if !first {
			b = append(b, ' ')
		}
		first = false
	}
	if tf.tcp {
		sep()
		b = append(b, "tcpflags="...)
		b = appendTCPFlags(b, rec.Flags())
	}
	v4 := true
	if tf.hasFam && fieldUint(rec, tf.family) == 6 {
		v4 = false
	}
	caplen := -1
	if tf.hasCaplen {
		caplen = int(fieldUint(rec, tf.caplen))
	}
	var lostTypes []string
	for i := range tf.fields {
		ff := &tf.fields[i]
		f := ff.f
		if ff.class == classLost {
			if n, ok := rec.FieldUint(f); ok && n > 0 {
				lostTypes = append(lostTypes, ff.lost+":"+strconv.FormatUint(n, 10))
			}
			continue
		}
		sep()
		b = append(b, f.Name...)
		b = append(b, '=')
		switch ff.class {
		case classIP:
			a, _ := rec.Addr(f.Name, v4)
			b = a.AppendTo(b)
		case classStr:
			s, _ := rec.Str(f.Name)
			if s == "" {
				s = "-"
			}
			b = append(b, sanitize(s)...)
		case classBytes:
			raw, _ := rec.Bytes(f.Name)
			if caplen >= 0 && caplen <= len(raw) {
				raw = raw[:caplen]
			}
			b = hex.AppendEncode(b, raw)
		case classEnum:
			v := fieldUint(rec, f)
			if name, ok := ff.enum[v]; ok {
				b = append(b, name...)
			} else {
				b = appendUint(b, v)
			}
		case classInt:
			v, _ := rec.FieldInt(f)
			b = appendInt(b, v)
		default:
			v := fieldUint(rec, f)
			b = appendUint(b, v)
			if ff.class == classIfindex {
				if name, ok := rs.ifaces[uint64(rec.NetNS())<<32|v]; ok {
					b = append(b, " iface="...)
					b = append(b, sanitize(name)...)
				}
			}
		}
	}
	if tf.lost {
		sep()
		b = append(b, "types="...)
		b = append(b, strings.Join(lostTypes, ",")...)
	}
	if first {
		b = append(b, '-')
	}
	return b
}

// fieldUint reads integer field f of a record in native byte order (what
// Reader.Next returns); the caller knows f is an integer of the record's
// type, which the reader has checked lies inside it.
func fieldUint(rec trace.Record, f trace.Field) uint64 {
	b := rec.Data
	if f.Offset < 0 || f.Offset+f.Size > len(b) {
		return 0
	}
	switch f.Size {
	case 1:
		return uint64(b[f.Offset])
	case 2:
		return uint64(binary.NativeEndian.Uint16(b[f.Offset:]))
	case 4:
		return uint64(binary.NativeEndian.Uint32(b[f.Offset:]))
	case 8:
		return binary.NativeEndian.Uint64(b[f.Offset:])
	}
	return 0
}

var tcpFlagChars = [...]struct {
	bit uint8
	c   byte
}{{0x02, 'S'}, {0x01, 'F'}, {0x08, 'P'}, {0x04, 'R'}, {0x20, 'U'}, {0x40, 'E'}, {0x80, 'W'}, {0x10, '.'}}

// TCPFlags renders TCP flags as tcpdump does: S, F, P, R, U, E, W, and "."
// for ACK.
func TCPFlags(f uint8) string {
	return string(appendTCPFlags(nil, f))
}

func appendTCPFlags(b []byte, f uint8) []byte {
	if f == 0 {
		return append(b, "none"...)
	}
	for _, fl := range tcpFlagChars {
		if f&fl.bit != 0 {
			b = append(b, fl.c)
		}
	}
	return b
}

// sanitize keeps a text column a single token: tabs, spaces and control
// characters in command names become '_'.
func sanitize(s string) string {
	if !strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return s
	}
	return strings.Map(func(r rune) rune {
		if r <= ' ' || r == 0x7f {
			return '_'
		}
		return r
	}, s)
}

// Endpoint formats an address and port as addr:port ([addr]:port for IPv6).
func Endpoint(a netip.Addr, port uint16) string {
	return netip.AddrPortFrom(a, port).String()
}

// Walk calls fn for every event of the trace r reads, in file order, with
// a resolver that has seen every metadata record (task, iface) before it;
// metadata records themselves are not passed on. An error from the reader
// is returned named after name; one from fn is returned as is.
func Walk(name string, r *trace.Reader, fn func(rs *Resolver, rec trace.Record) error) error {
	rs := NewResolver(r.Header())
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if rs.Observe(rec) {
			continue
		}
		if err := fn(rs, rec); err != nil {
			return err
		}
	}
}

const digitPairs = "00010203040506070809101112131415161718192021222324252627282930313233343536373839" +
	"40414243444546474849505152535455565758596061626364656667686970717273747576777879" +
	"8081828384858687888990919293949596979899"

// appendUint appends v in decimal, written in place: strconv.AppendUint
// formats into a buffer of its own and copies, which is a fifth of
// `magnet parse`'s time when every line has a dozen numbers.
func appendUint(b []byte, v uint64) []byte {
	if v < 10 {
		return append(b, byte('0'+v))
	}
	n := 1
	for p := v; p >= 10; p /= 10 {
		n++
	}
	b = slices.Grow(b, n)
	i := len(b) + n
	b = b[:i]
	for v >= 100 {
		q := v / 100
		r := (v - q*100) * 2
		i -= 2
		b[i], b[i+1] = digitPairs[r], digitPairs[r+1]
		v = q
	}
	if v >= 10 {
		b[i-2], b[i-1] = digitPairs[v*2], digitPairs[v*2+1]
	} else {
		b[i-1] = byte('0' + v)
	}
	return b
}

// appendInt is appendUint for a signed value.
func appendInt(b []byte, v int64) []byte {
	if v < 0 {
		return appendUint(append(b, '-'), uint64(-v))
	}
	return appendUint(b, uint64(v))
}
