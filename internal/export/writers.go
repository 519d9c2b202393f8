// SPDX-License-Identifier: Apache-2.0

package export

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// NewRowWriter returns a writer of rows of t in format (tsv, csv, jsonl or
// parquet) to w. Close flushes; it does not close w.
func NewRowWriter(format string, t *Table, w io.Writer) (RowWriter, error) {
	switch format {
	case "csv", "tsv":
		return newDelimited(format, t, w)
	case "jsonl":
		return &jsonlWriter{t: t, w: bufio.NewWriterSize(w, 256<<10)}, nil
	case "parquet":
		return newParquetWriter(t, w)
	case "ulm":
		return &ulmWriter{t: t, w: bufio.NewWriterSize(w, 256<<10)}, nil
	}
	return nil, CheckFormat(format)
}

// delimitedWriter writes CSV (RFC 4180, as encoding/csv writes it) or the
// same with tabs, with a header line; a null cell is empty. Cells are
// appended to one buffer per row rather than written field by field: a row
// has a column for every field of every event type, most of them empty.
type delimitedWriter struct {
	t     *Table
	w     *bufio.Writer
	comma byte
	buf   []byte
}

func newDelimited(format string, t *Table, w io.Writer) (*delimitedWriter, error) {
	d := &delimitedWriter{t: t, w: bufio.NewWriterSize(w, 256<<10), comma: ','}
	if format == "tsv" {
		d.comma = '\t'
	}
	b := d.buf[:0]
	for i, c := range t.Columns {
		if i > 0 {
			b = append(b, d.comma)
		}
		b = d.appendField(b, c.Name)
	}
	d.buf = append(b, '\n')
	if _, err := d.w.Write(d.buf); err != nil {
		return nil, err
	}
	return d, nil
}

// appendField appends s, quoted when encoding/csv would quote it: it holds
// the separator, a quote or a line break, starts with a space or a tab, or
// is the PostgreSQL end-of-data marker.
func (d *delimitedWriter) appendField(b []byte, s string) []byte {
	quote := s == `\.`
	if !quote && s != "" {
		quote = s[0] == ' ' || s[0] == '\t' || strings.ContainsAny(s, "\"\r\n") || strings.IndexByte(s, d.comma) >= 0
	}
	if !quote {
		return append(b, s...)
	}
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' {
			b = append(b, '"')
		}
		b = append(b, s[i])
	}
	return append(b, '"')
}

func (d *delimitedWriter) WriteRow(row []Value) error {
	b := d.buf[:0]
	for i, v := range row {
		if i > 0 {
			b = append(b, d.comma)
		}
		if v.Null {
			continue
		}
		switch d.t.Columns[i].Kind {
		case KindInt:
			b = strconv.AppendInt(b, v.Int, 10)
		case KindUint:
			b = strconv.AppendUint(b, v.Uint, 10)
		default:
			b = d.appendField(b, v.Str)
		}
	}
	d.buf = append(b, '\n')
	_, err := d.w.Write(d.buf)
	return err
}

func (d *delimitedWriter) Close() error {
	return d.w.Flush()
}

// jsonlWriter writes one JSON object per row, columns in table order, nulls
// left out, numbers as numbers.
type jsonlWriter struct {
	t   *Table
	w   *bufio.Writer
	buf []byte
}

func (j *jsonlWriter) WriteRow(row []Value) error {
	b := append(j.buf[:0], '{')
	first := true
	for i, v := range row {
		if v.Null {
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = strconv.AppendQuote(b, j.t.Columns[i].Name)
		b = append(b, ':')
		switch j.t.Columns[i].Kind {
		case KindInt:
			b = strconv.AppendInt(b, v.Int, 10)
		case KindUint:
			b = strconv.AppendUint(b, v.Uint, 10)
		default:
			s, err := json.Marshal(v.Str)
			if err != nil {
				return fmt.Errorf("encode %s: %w", j.t.Columns[i].Name, err)
			}
			b = append(b, s...)
		}
	}
	b = append(b, '}', '\n')
	j.buf = b
	_, err := j.w.Write(b)
	return err
}

func (j *jsonlWriter) Close() error { return j.w.Flush() }

// ConnColumns are the columns of the connection table export.
var ConnColumns = []Column{
	{"trace", KindString}, {"conn", KindUint}, {"proto", KindString}, {"local", KindString}, {"remote", KindString},
	{"netns", KindUint}, {"pid", KindUint}, {"comm", KindString}, {"peer", KindUint}, {"peer_trace", KindString}, {"open_ns", KindInt},
	{"close_ns", KindInt}, {"events", KindUint}, {"app_bytes_sent", KindInt}, {"app_bytes_received", KindInt},
}

// ConnRow turns a connection of trace name into a row of ConnColumns;
// times are wall-clock ns.
func ConnRow(name string, c *Conn, wallOffset int64) []Value {
	null := Value{Null: true}
	peer, peerTrace, closed := null, null, null
	if c.Peer != 0 {
		peer = Value{Uint: c.Peer}
	}
	if c.PeerTrace != "" {
		peerTrace = Value{Str: c.PeerTrace}
	}
	if c.CloseNs != 0 {
		closed = Value{Int: int64(c.CloseNs) + wallOffset}
	}
	return []Value{
		{Str: name}, {Uint: c.ID}, {Str: c.Proto}, {Str: endpoint(c.Local)}, {Str: endpoint(c.Remote)},
		{Uint: uint64(c.NetNS)}, {Uint: uint64(c.PID)}, {Str: c.Comm}, peer, peerTrace, {Int: int64(c.OpenNs) + wallOffset},
		closed, {Uint: c.Events}, {Int: c.SentApp}, {Int: c.RecvApp},
	}
}

// ConnTable is the table of ConnColumns.
func ConnTable() *Table {
	t := &Table{Columns: ConnColumns, index: map[string]int{}}
	for i, c := range t.Columns {
		t.index[c.Name] = i
	}
	return t
}

// ulmWriter writes NetLogger Universal Logger Message lines, as MAGNET 2.0
// fed its NLV viewer: DATE (UTC, microseconds), HOST, PROG, LVL, NL.EVNT,
// then every non-null column as MAGNET.<NAME>=value. Values with spaces are
// quoted.
type ulmWriter struct {
	t   *Table
	w   *bufio.Writer
	buf []byte
}

func (u *ulmWriter) WriteRow(row []Value) error {
	col := func(name string) Value { return row[u.t.index[name]] }
	ts := time.Unix(0, col("time_ns").Int).UTC()
	b := append(u.buf[:0], "DATE="...)
	b = ts.AppendFormat(b, "20060102150405.000000")
	b = append(b, " HOST="...)
	b = appendULMValue(b, col("host").Str)
	b = append(b, " PROG=magnet LVL=Usage NL.EVNT="...)
	b = appendULMValue(b, col("event").Str)
	for i, v := range row {
		name := u.t.Columns[i].Name
		if v.Null || name == "host" || name == "event" || name == "time_ns" {
			continue
		}
		b = append(b, " MAGNET."...)
		b = append(b, strings.ToUpper(name)...)
		b = append(b, '=')
		b = appendULMValue(b, v.String(u.t.Columns[i].Kind))
	}
	b = append(b, '\n')
	u.buf = b
	_, err := u.w.Write(b)
	return err
}

func appendULMValue(b []byte, s string) []byte {
	if s == "" || strings.ContainsAny(s, " \t\n\"=") {
		return strconv.AppendQuote(b, s)
	}
	return append(b, s...)
}

func (u *ulmWriter) Close() error { return u.w.Flush() }
