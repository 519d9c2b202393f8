// SPDX-License-Identifier: Apache-2.0

package export

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/parquet-go/parquet-go"

	"github.com/magnet-tracer/magnet/internal/trace"
)

// DatasetOptions shape a Parquet dataset.
type DatasetOptions struct {
	// Partition names the directory levels, in order: "host", "date"
	// (UTC date of the trace file's start, YYYY-MM-DD), as Hive's
	// key=value directories. A column that is a level is not in the files.
	Partition []string
	// RowGroupRows bounds a row group (0: DatasetRowGroup).
	RowGroupRows int
	// Log receives one line per file written or skipped.
	Log func(format string, args ...any)
	// perValue writes the events through parquet-go's column writers, as
	// before the chunkWriter: the tests compare the two.
	perValue bool
}

// DatasetStats say what WriteDataset did.
type DatasetStats struct {
	Written, Skipped int    // trace files
	Events, Conns    uint64 // rows written
}

// DatasetRowGroup is the default row group: about 1M events make 30-60 MB
// of column data before compression, what Spark, Trino and DuckDB read
// well (one task per row group) without holding much in memory here.
const DatasetRowGroup = 1 << 20

// datasetBatch is how many rows are staged per column before they go to
// the column writers.
const datasetBatch = 8192

// CheckPartition validates --partition.
func CheckPartition(levels []string) error {
	seen := map[string]bool{}
	for _, l := range levels {
		if l != "host" && l != "date" {
			return fmt.Errorf("--partition %q: want host, date or both", l)
		}
		if seen[l] {
			return fmt.Errorf("--partition: %s given twice", l)
		}
		seen[l] = true
	}
	return nil
}

// WriteDataset writes the trace files paths as a Hive-partitioned Parquet
// dataset under dir: dir/events/host=H/date=D/NAME.parquet, one row per
// event, and dir/conns/host=H/date=D/NAME.parquet, one row per connection
// seen in the file, NAME being the trace file's name without .mgt(.zst).
// A trace file whose two outputs exist already is skipped, so a second run
// over a grown archive adds only the new files. Each output is written
// under a dot-name that engines ignore and renamed into place, the events
// file last: it commits the pair.
//
// The events carry the records as they happened: the task and iface
// records are resolved into pid/comm columns (not rows), and a
// conn_open that rotation repeated at the start of a file (trace.FlagCarried)
// is not a row again; the connection's row in that file's conns table says
// carried = true instead.
func WriteDataset(dir string, paths []string, opts DatasetOptions) (DatasetStats, error) {
	var st DatasetStats
	if opts.RowGroupRows <= 0 {
		opts.RowGroupRows = DatasetRowGroup
	}
	if opts.Log == nil {
		opts.Log = func(string, ...any) {}
	}
	if err := CheckPartition(opts.Partition); err != nil {
		return st, err
	}
	for _, p := range paths {
		wrote, ev, cs, err := writeDatasetFile(dir, p, opts)
		if err != nil {
			return st, fmt.Errorf("%s: %w", filepath.Base(p), err)
		}
		if wrote {
			st.Written++
			st.Events += ev
			st.Conns += cs
		} else {
			st.Skipped++
		}
	}
	return st, nil
}

// datasetName is the name of a trace file without its .mgt(.zst).
func datasetName(p string) string {
	b := filepath.Base(p)
	b = strings.TrimSuffix(b, ".zst")
	return strings.TrimSuffix(b, ".mgt")
}

func writeDatasetFile(dir, path string, opts DatasetOptions) (wrote bool, events, conns uint64, err error) {
	r, err := trace.Open(path)
	if err != nil {
		return false, 0, 0, err
	}
	defer r.Close()
	h := r.Header()
	evPath, cnPath, host, date, inFile := datasetPaths(dir, h.Host, h.StartWallNs, path, opts.Partition)
	name := filepath.Base(evPath)
	if exists(evPath) && exists(cnPath) {
		opts.Log("%s: in the dataset already", filepath.Base(path))
		return false, 0, 0, nil
	}
	for _, p := range []string{evPath, cnPath} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return false, 0, 0, err
		}
	}
	evTmp := filepath.Join(filepath.Dir(evPath), "."+name+".part")
	cnTmp := filepath.Join(filepath.Dir(cnPath), "."+name+".part")
	defer os.Remove(evTmp)
	defer os.Remove(cnTmp)

	ef, err := os.Create(evTmp)
	if err != nil {
		return false, 0, 0, err
	}
	defer ef.Close()
	ew, err := newEventsWriter(h, ef, filepath.Base(path), host, date, inFile, opts.RowGroupRows, opts.perValue)
	if err != nil {
		return false, 0, 0, err
	}
	rs := NewResolver(h)
	tl := NewTimeline([]*trace.Header{h})
	byID := map[uint64]*datasetConn{}
	var order []*datasetConn
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return false, 0, 0, err
		}
		if rs.Observe(rec) {
			continue
		}
		carried := rec.Flags()&trace.FlagCarried != 0
		if id := rec.Conn(); id != 0 {
			c := byID[id]
			if c == nil {
				c = &datasetConn{Conn: Conn{ID: id, OpenNs: rec.Time()}, carried: carried && rec.Type.Name == "conn_open"}
				byID[id] = c
				order = append(order, c)
			}
			c.Observe(rs, rec)
		}
		if carried {
			continue
		}
		if err := ew.add(rs, rec, tl.Wall(0, rec.Time())); err != nil {
			return false, 0, 0, err
		}
	}
	if err := ew.close(); err != nil {
		return false, 0, 0, err
	}
	if err := ef.Sync(); err != nil {
		return false, 0, 0, err
	}
	if err := ef.Close(); err != nil {
		return false, 0, 0, err
	}

	cf, err := os.Create(cnTmp)
	if err != nil {
		return false, 0, 0, err
	}
	defer cf.Close()
	if err := writeDatasetConns(cf, order, tl, filepath.Base(path), host, date, inFile); err != nil {
		return false, 0, 0, err
	}
	if err := cf.Sync(); err != nil {
		return false, 0, 0, err
	}
	if err := cf.Close(); err != nil {
		return false, 0, 0, err
	}
	if err := os.Rename(cnTmp, cnPath); err != nil {
		return false, 0, 0, err
	}
	if err := os.Rename(evTmp, evPath); err != nil {
		return false, 0, 0, err
	}
	opts.Log("%s: %d events, %d connections -> %s", filepath.Base(path), ew.rows, len(order), evPath)
	return true, ew.rows, uint64(len(order)), nil
}

// datasetPaths is where the dataset under dir keeps the events and conns
// of the trace file path (of host, started at startWallNs), with the
// partition values and which of host and date are columns in the files.
func datasetPaths(dir, host string, startWallNs int64, path string, partition []string) (events, conns, h, date string, inFile map[string]bool) {
	if host == "" {
		host = "_"
	}
	date = time.Unix(0, startWallNs).UTC().Format("2006-01-02")
	rel := ""
	inFile = map[string]bool{"host": true, "date": true}
	for _, l := range partition {
		v := host
		if l == "date" {
			v = date
		}
		rel = filepath.Join(rel, l+"="+partitionValue(v))
		inFile[l] = false
	}
	name := datasetName(path) + ".parquet"
	return filepath.Join(dir, "events", rel, name), filepath.Join(dir, "conns", rel, name), host, date, inFile
}

// DatasetHas reports whether the dataset under dir holds the trace file
// path of host, started at startWallNs: a run can then leave it out
// before it is even fetched from an archive.
func DatasetHas(dir, host string, startWallNs int64, path string, partition []string) bool {
	ev, cn, _, _, _ := datasetPaths(dir, host, startWallNs, path, partition)
	return exists(ev) && exists(cn)
}

// partitionValue keeps a partition value one path element that Hive-style
// readers take as is.
func partitionValue(s string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '/', '\\', '=', '%', ':', '*', '?', '"', '<', '>', '|':
			return '_'
		}
		if r < ' ' {
			return '_'
		}
		return r
	}, s)
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

type datasetConn struct {
	Conn
	carried bool
}

// colWriter stages a Parquet file's rows column by column and hands each
// column's values to its column writer in batches: no row is ever
// assembled, which the row-wise writer spends most of its time on.
type colWriter struct {
	w      *parquet.GenericWriter[any]
	cols   []*stagedCol
	byName map[string]*stagedCol
	rows   uint64 // rows written
	batch  int    // rows staged
	group  int    // rows in the current row group
	max    int
}

type stagedCol struct {
	leaf  int
	def   int // the definition level of a value: 1 if optional, else 0
	vals  []parquet.Value
	nulls []parquet.Value // datasetBatch nulls of this column, copied in runs
}

// pad fills c with nulls up to n rows.
func (c *stagedCol) pad(n int) {
	if k := n - len(c.vals); k > 0 {
		c.vals = append(c.vals, c.nulls[:k]...)
	}
}

func newColWriter(out io.Writer, group parquet.Group, maxGroup int) *colWriter {
	schema := parquet.NewSchema("magnet", group)
	cw := &colWriter{
		w:      parquet.NewGenericWriter[any](out, schema, parquet.Compression(parquetZstd), parquet.MaxRowsPerRowGroup(int64(maxGroup))),
		byName: map[string]*stagedCol{},
		max:    maxGroup,
	}
	for i, path := range schema.Columns() {
		leaf, _ := schema.Lookup(path...)
		c := &stagedCol{leaf: i, def: leaf.MaxDefinitionLevel, vals: make([]parquet.Value, 0, datasetBatch), nulls: make([]parquet.Value, datasetBatch)}
		for j := range c.nulls {
			c.nulls[j] = parquet.NullValue().Level(0, 0, i)
		}
		cw.cols = append(cw.cols, c)
		cw.byName[path[0]] = c
	}
	return cw
}

// set gives the current row's value of column c; columns not set are null.
func (cw *colWriter) set(c *stagedCol, v parquet.Value) {
	c.pad(cw.batch)
	if c.def == 0 {
		// A required column's buffer reads the value alone; its levels
		// are zero already.
		c.vals = append(c.vals, v)
	} else {
		c.vals = append(c.vals, v.Level(0, c.def, c.leaf))
	}
}

// endRow closes the current row.
func (cw *colWriter) endRow() error {
	cw.batch++
	if cw.batch >= datasetBatch {
		return cw.flush()
	}
	return nil
}

func (cw *colWriter) flush() error {
	if cw.batch == 0 {
		return nil
	}
	writers := cw.w.ColumnWriters()
	for _, c := range cw.cols {
		vals := c.vals
		if len(vals) == 0 {
			vals = c.nulls[:cw.batch] // none set in the batch: no copy
		} else {
			c.pad(cw.batch)
			vals = c.vals
		}
		if _, err := writers[c.leaf].WriteRowValues(vals); err != nil {
			return fmt.Errorf("write parquet: %w", err)
		}
		c.vals = c.vals[:0]
	}
	cw.rows += uint64(cw.batch)
	cw.group += cw.batch
	cw.batch = 0
	if cw.group >= cw.max {
		cw.group = 0
		if err := cw.w.Flush(); err != nil {
			return fmt.Errorf("write parquet: %w", err)
		}
	}
	return nil
}

// colWriter is a cellSink: the events' writer before the chunkWriter.
func (cw *colWriter) leaf(name string) int {
	if c := cw.byName[name]; c != nil {
		return c.leaf
	}
	return -1
}
func (cw *colWriter) putInt64(li int, v int64) { cw.set(cw.cols[li], parquet.Int64Value(v)) }
func (cw *colWriter) putInt32(li int, v int32) { cw.set(cw.cols[li], parquet.Int32Value(v)) }
func (cw *colWriter) putString(li int, v string) {
	cw.set(cw.cols[li], parquet.ByteArrayValue([]byte(v)))
}

func (cw *colWriter) close() error {
	if err := cw.flush(); err != nil {
		return err
	}
	if err := cw.w.Close(); err != nil {
		return fmt.Errorf("write parquet: %w", err)
	}
	return nil
}

func optional(n parquet.Node) parquet.Node { return parquet.Optional(n) }

func stringNode() parquet.Node {
	return parquet.Encoded(parquet.String(), &parquet.RLEDictionary)
}

// tsNode is a TIMESTAMP(MICROS, UTC): the unit every engine reads (Spark
// refuses nanoseconds); time_ns keeps the full precision beside it.
func tsNode() parquet.Node { return parquet.Timestamp(parquet.Microsecond) }

// cellSink takes a Parquet file's rows cell by cell, leaves by index.
type cellSink interface {
	leaf(name string) int // -1: not in the schema
	putInt64(li int, v int64)
	putInt32(li int, v int32)
	putString(li int, v string)
	endRow() error
	close() error
}

// eventsWriter writes the events table of one trace file.
type eventsWriter struct {
	cw    cellSink
	h     *trace.Header
	fixed struct {
		trace, host, date, timeNs, ts, cpu, pid, tid, comm, netns, conn, event, size, errno, tcpflags int
	}
	traceV, hostV, dateV string
	types                [256][]fieldCol // by event type id
	rows                 uint64
	eventV               [256]string
}

type fieldCol struct {
	f    trace.Field
	col  int
	kind ColumnKind
}

func newEventsWriter(h *trace.Header, out io.Writer, traceName, host, date string, inFile map[string]bool, maxGroup int, perValue bool) (*eventsWriter, error) {
	t := NewTable([]*trace.Header{h})
	group := parquet.Group{}
	for _, c := range t.Columns {
		switch c.Name {
		case "host":
			if inFile["host"] {
				group["host"] = stringNode()
			}
			continue
		case "trace", "event":
			group[c.Name] = stringNode()
			continue
		case "time_ns", "tid", "netns":
			group[c.Name] = parquet.Int(64)
			continue
		case "cpu":
			group[c.Name] = parquet.Int(32)
			continue
		}
		switch c.Kind {
		case KindString:
			group[c.Name] = optional(stringNode())
		default: // signed: Spark and Trino read unsigned 64-bit as decimal(20,0)
			group[c.Name] = optional(parquet.Int(64))
		}
	}
	if inFile["date"] {
		group["date"] = stringNode()
	}
	group["ts"] = tsNode()
	group["error"] = optional(parquet.Int(32))
	ew := &eventsWriter{h: h}
	if perValue {
		ew.cw = newColWriter(out, group, maxGroup)
	} else {
		cw, err := newChunkWriter(out, parquet.NewSchema("magnet", group), maxGroup, parquetGroupBytes)
		if err != nil {
			return nil, err
		}
		ew.cw = cw
	}
	b := ew.cw.leaf
	ew.fixed.trace, ew.fixed.host, ew.fixed.date = b("trace"), b("host"), b("date")
	ew.fixed.timeNs, ew.fixed.ts, ew.fixed.cpu, ew.fixed.pid, ew.fixed.tid = b("time_ns"), b("ts"), b("cpu"), b("pid"), b("tid")
	ew.fixed.comm, ew.fixed.netns, ew.fixed.conn, ew.fixed.event = b("comm"), b("netns"), b("conn"), b("event")
	ew.fixed.size, ew.fixed.errno, ew.fixed.tcpflags = b("size"), b("error"), b("tcpflags")
	ew.traceV, ew.hostV, ew.dateV = traceName, host, date
	for _, et := range h.Types {
		var fcs []fieldCol
		for _, f := range et.Fields {
			i, ok := t.index[f.Name]
			if !ok || t.Columns[i].Kind != columnKind(f) {
				if i, ok = t.index[et.Name+"_"+f.Name]; !ok {
					continue
				}
			}
			if col := b(t.Columns[i].Name); col >= 0 {
				fcs = append(fcs, fieldCol{f: f, col: col, kind: t.Columns[i].Kind})
			}
		}
		ew.types[et.ID] = fcs
		ew.eventV[et.ID] = et.Name
	}
	return ew, nil
}

func (ew *eventsWriter) add(rs *Resolver, rec trace.Record, wall int64) error {
	cw, fx := ew.cw, &ew.fixed
	cw.putString(fx.trace, ew.traceV)
	if fx.host >= 0 {
		cw.putString(fx.host, ew.hostV)
	}
	if fx.date >= 0 {
		cw.putString(fx.date, ew.dateV)
	}
	cw.putInt64(fx.timeNs, wall)
	cw.putInt64(fx.ts, wall/1000)
	cw.putInt32(fx.cpu, int32(rec.CPU()))
	name := rec.Type.Name
	if pid, comm, ok := rs.Task(rec.TID()); ok && name != "lost" {
		cw.putInt64(fx.pid, int64(pid))
		cw.putString(fx.comm, comm)
	}
	cw.putInt64(fx.tid, int64(rec.TID()))
	cw.putInt64(fx.netns, int64(rec.NetNS()))
	if c := rec.Conn(); c != 0 {
		cw.putInt64(fx.conn, int64(c))
	}
	cw.putString(fx.event, ew.eventV[rec.Type.ID])
	// size is a byte count; a negative one is a kernel error code, which
	// gets a column of its own so that sum(size) means bytes.
	if n := rec.Size(); n >= 0 {
		cw.putInt64(fx.size, int64(n))
	} else {
		cw.putInt32(fx.errno, -n)
	}
	fcs := ew.types[rec.Type.ID]
	if len(fcs) > 0 {
		v4 := true
		if fam, ok := rec.Uint("family"); ok && fam == 6 {
			v4 = false
		}
		caplen := -1
		if n, ok := rec.Uint("caplen"); ok {
			caplen = int(n)
		}
		for _, fc := range fcs {
			f := fc.f
			switch {
			case f.Kind == "ip":
				a, _ := rec.Addr(f.Name, v4)
				cw.putString(fc.col, a.String())
			case f.Kind == "str":
				s, _ := rec.Str(f.Name)
				cw.putString(fc.col, s)
			case f.Kind == "bytes":
				b, _ := rec.Bytes(f.Name)
				if caplen >= 0 && caplen <= len(b) {
					b = b[:caplen]
				}
				cw.putString(fc.col, hex.EncodeToString(b))
			case f.Enum() != "":
				n, _ := rec.Uint(f.Name)
				s, ok := ew.h.EnumName(f, n)
				if !ok {
					s = strconv.FormatUint(n, 10)
				}
				cw.putString(fc.col, s)
			case f.Kind == "i":
				n, _ := rec.Int(f.Name)
				cw.putInt64(fc.col, n)
			default:
				n, _ := rec.Uint(f.Name)
				cw.putInt64(fc.col, int64(n))
			}
		}
	}
	if fx.tcpflags >= 0 && (name == "tcp_xmit" || name == "tcp_rcv" || name == "tcp_retrans") {
		cw.putString(fx.tcpflags, TCPFlags(rec.Flags()))
	}
	ew.rows++
	return cw.endRow()
}

func (ew *eventsWriter) close() error { return ew.cw.close() }

// writeDatasetConns writes the connection table of one trace file.
func writeDatasetConns(out io.Writer, cs []*datasetConn, tl *Timeline, traceName, host, date string, inFile map[string]bool) error {
	plain := make([]*Conn, len(cs))
	for i, c := range cs {
		plain[i] = &c.Conn
	}
	PairConns(plain)
	group := parquet.Group{
		"trace": stringNode(), "conn": parquet.Int(64), "proto": optional(stringNode()),
		"local": optional(stringNode()), "remote": optional(stringNode()), "netns": parquet.Int(64),
		"pid": optional(parquet.Int(64)), "comm": optional(stringNode()), "peer": optional(parquet.Int(64)),
		"open_ns": parquet.Int(64), "open_ts": tsNode(), "close_ns": optional(parquet.Int(64)), "close_ts": optional(tsNode()),
		"events": parquet.Int(64), "app_bytes_sent": parquet.Int(64), "app_bytes_received": parquet.Int(64),
		"carried": parquet.Leaf(parquet.BooleanType),
	}
	if inFile["host"] {
		group["host"] = stringNode()
	}
	if inFile["date"] {
		group["date"] = stringNode()
	}
	cw := newColWriter(out, group, DatasetRowGroup)
	b := cw.byName
	str := func(s string) parquet.Value { return parquet.ByteArrayValue([]byte(s)) }
	for _, c := range cs {
		cw.set(b["trace"], str(traceName))
		if col := b["host"]; col != nil {
			cw.set(col, str(host))
		}
		if col := b["date"]; col != nil {
			cw.set(col, str(date))
		}
		cw.set(b["conn"], parquet.Int64Value(int64(c.ID)))
		if c.Proto != "" {
			cw.set(b["proto"], str(c.Proto))
			cw.set(b["local"], str(endpoint(c.Local)))
			cw.set(b["remote"], str(endpoint(c.Remote)))
		}
		cw.set(b["netns"], parquet.Int64Value(int64(c.NetNS)))
		if c.Comm != "" || c.PID != 0 {
			cw.set(b["pid"], parquet.Int64Value(int64(c.PID)))
			cw.set(b["comm"], str(c.Comm))
		}
		if c.Peer != 0 {
			cw.set(b["peer"], parquet.Int64Value(int64(c.Peer)))
		}
		open := tl.Wall(0, c.OpenNs)
		cw.set(b["open_ns"], parquet.Int64Value(open))
		cw.set(b["open_ts"], parquet.Int64Value(open/1000))
		if c.CloseNs != 0 {
			cl := tl.Wall(0, c.CloseNs)
			cw.set(b["close_ns"], parquet.Int64Value(cl))
			cw.set(b["close_ts"], parquet.Int64Value(cl/1000))
		}
		cw.set(b["events"], parquet.Int64Value(int64(c.Events)))
		cw.set(b["app_bytes_sent"], parquet.Int64Value(c.SentApp))
		cw.set(b["app_bytes_received"], parquet.Int64Value(c.RecvApp))
		cw.set(b["carried"], parquet.BooleanValue(c.carried))
		if err := cw.endRow(); err != nil {
			return err
		}
	}
	return cw.close()
}
