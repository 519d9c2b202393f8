// SPDX-License-Identifier: Apache-2.0

// Package evselect selects the events of recorded traces the way the
// daemon selects live ones (docs/FILTERS.md): by a pcap-filter expression
// over the event's connection (internal/pcapfilter), by a CEL expression
// over its fields (internal/filter, the daemon's language), and by event
// types and groups. The readers (parse, export, report, plot) share it so
// that one expression means the same everywhere.
package evselect

import (
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/filter"
	"github.com/magnet-tracer/magnet/internal/pcapfilter"
	"github.com/magnet-tracer/magnet/internal/trace"
	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// SplitArgs splits a reader's arguments into traces and a pcap-filter
// expression, as tcpdump takes its expression from the arguments left
// over: the traces are the arguments up to the first that names no
// existing file or directory (an s3:// or ssh:// archive counts as a
// trace); that one and the rest, joined with spaces, are the expression.
// dash is cobra's ArgsLenAtDash: with "--", the arguments before it are
// the traces, whatever they name, and those after it the expression.
func SplitArgs(args []string, dash int) (traces []string, expr string) {
	if dash >= 0 {
		return args[:dash], strings.Join(args[dash:], " ")
	}
	i := 0
	for ; i < len(args); i++ {
		a := args[i]
		if strings.HasPrefix(a, "s3://") || strings.HasPrefix(a, "ssh://") {
			continue
		}
		if _, err := os.Stat(a); err != nil {
			break
		}
	}
	return args[:i], strings.Join(args[i:], " ")
}

// ParsePcap parses the expression SplitArgs left; "" is none. When it does
// not parse and its first word looks like a file name, the error says the
// file is missing instead: a misspelt trace reads as an expression.
func ParsePcap(expr string) (*pcapfilter.Expr, error) {
	if strings.TrimSpace(expr) == "" {
		return nil, nil
	}
	e, err := pcapfilter.Parse(expr)
	if err != nil {
		first, _, _ := strings.Cut(strings.TrimSpace(expr), " ")
		if strings.ContainsAny(first, "/") || strings.HasSuffix(first, ".mgt") {
			return nil, fmt.Errorf("%s: no such file or directory", first)
		}
		return nil, err
	}
	return e, nil
}

// Options are what to select; the zero value selects everything.
type Options struct {
	Pcap   *pcapfilter.Expr // over the event's connection
	Expr   string           // CEL over the event's fields (docs/DAEMON.md#filters)
	Types  []string         // event type names
	Groups []string         // event group names
	Conn   uint64           // one connection id
}

// Selector decides per record. Build it with New, then Apply it to the
// sources it was built for: whatever reads them sees only what it keeps.
type Selector struct {
	opts    Options
	headers []*trace.Header
	cel     *filter.Filter
	types   map[string]bool // by name: the files of a chain have types of their own
	needTab bool
	srcs    []*srcState
}

type srcState struct {
	header *trace.Header
	conns  map[uint64]*export.Conn
	match  map[uint64]bool // pcap result per connection
}

// Active reports whether opts select anything less than every record.
func (o Options) Active() bool {
	return o.Pcap != nil || o.Expr != "" || len(o.Types) > 0 || len(o.Groups) > 0 || o.Conn != 0
}

// New checks opts against the traces' dictionaries (an event type or a
// field no trace has is an error, not an empty result) and, when an
// expression needs them, reads each source once to learn its connections.
func New(inputs []trace.Source, opts Options) (*Selector, error) {
	s := &Selector{opts: opts}
	headers := make([]*trace.Header, 0, len(inputs))
	for _, in := range inputs {
		r, err := in.Open()
		if err != nil {
			return nil, err
		}
		headers = append(headers, r.Header())
		r.Close()
	}
	s.headers = headers
	if len(opts.Types) > 0 || len(opts.Groups) > 0 {
		s.types = map[string]bool{}
		for _, name := range opts.Types {
			name = strings.TrimSpace(name)
			if !anyHas(headers, func(h *trace.Header) bool { return h.TypeByName(name) != nil }) {
				return nil, fmt.Errorf("unknown event type %q (the traces have %s)", name, strings.Join(typeNames(headers), ", "))
			}
			s.types[name] = true
		}
		for _, g := range opts.Groups {
			g = strings.TrimSpace(g)
			found := false
			for _, h := range headers {
				for _, et := range h.Types {
					if et.Group == g {
						s.types[et.Name], found = true, true
					}
				}
			}
			if !found {
				if _, err := event.ParseGroups(g); err != nil {
					return nil, fmt.Errorf("unknown event group %q", g)
				}
				return nil, fmt.Errorf("no event of group %q in the traces (they have %s)", g, strings.Join(groupNames(headers), ", "))
			}
		}
	}
	if opts.Expr != "" {
		f, err := filter.Parse(magnetclient.Filter{Expr: opts.Expr}, filter.Options{})
		if err != nil {
			return nil, fmt.Errorf("--filter: %w", err)
		}
		if err := checkFields(opts.Expr, headers); err != nil {
			return nil, err
		}
		s.cel = f
	}
	s.needTab = opts.Pcap != nil || opts.Expr != ""
	if !s.needTab {
		return s, nil
	}
	for _, in := range inputs {
		st, err := learn(in, opts.Pcap)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", in.Name, err)
		}
		s.srcs = append(s.srcs, st)
	}
	return s, nil
}

func anyHas(hs []*trace.Header, f func(*trace.Header) bool) bool {
	return slices.ContainsFunc(hs, f)
}

func typeNames(hs []*trace.Header) []string {
	var names []string
	for _, h := range hs {
		for _, et := range h.Types {
			if !slices.Contains(names, et.Name) {
				names = append(names, et.Name)
			}
		}
	}
	return names
}

func groupNames(hs []*trace.Header) []string {
	var names []string
	for _, h := range hs {
		for _, et := range h.Types {
			if et.Group != "" && !slices.Contains(names, et.Group) {
				names = append(names, et.Group)
			}
		}
	}
	return names
}

// CheckFields refuses an expression naming a field that no event type in
// types has, as the readers do: the recorder checks a --filter with it
// before it creates its output, so that a misspelt field does not replace
// the file at -o with an empty trace.
func CheckFields(expr string, types []trace.EventType) error {
	return checkFields(expr, []*trace.Header{{Types: types}})
}

// checkFields refuses an expression naming a field no event of the traces
// has: it would match nothing, silently.
func checkFields(expr string, hs []*trace.Header) error {
	for _, r := range filter.FieldRefs(expr) {
		has := anyHas(hs, func(h *trace.Header) bool {
			for _, et := range h.Types {
				for _, f := range et.Fields {
					if f.Name == r.Name {
						return true
					}
				}
			}
			return false
		})
		if !has {
			return fmt.Errorf("--filter: column %d: no event in the traces has a field %q (see magnet parse --header)", r.Column, r.Name)
		}
	}
	return nil
}

// learn reads a source once for its connections, as export.Conns builds
// them.
func learn(in trace.Source, pcap *pcapfilter.Expr) (*srcState, error) {
	r, err := in.Open()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	st := &srcState{header: r.Header(), conns: map[uint64]*export.Conn{}, match: map[uint64]bool{}}
	rs := export.NewResolver(r.Header())
	for {
		rec, err := r.Next()
		if err != nil {
			// A damaged trace: the connections read so far still
			// select, and the reader's own pass reports the error.
			break
		}
		if rs.Observe(rec) {
			continue
		}
		if id := rec.Conn(); id != 0 {
			c := st.conns[id]
			if c == nil {
				c = &export.Conn{ID: id, OpenNs: rec.Time()}
				st.conns[id] = c
			}
			c.Observe(rs, rec)
		}
	}
	for id, c := range st.conns {
		if pcap != nil && c.Proto != "" {
			st.match[id] = pcap.Match(pcapfilter.Conn{Proto: protoNum(c.Proto), Local: c.Local, Remote: c.Remote})
		}
	}
	return st, nil
}

func protoNum(p string) uint8 {
	switch p {
	case "tcp":
		return 6
	case "udp":
		return 17
	}
	return 0
}

// Apply makes inputs (those New was given) read only the selected records.
func (s *Selector) Apply(inputs []trace.Source) {
	for i := range inputs {
		h := s.headers[i]
		inputs[i].Keep = func() func(trace.Record) bool {
			// Each reader names threads as its own pass meets their task
			// records, as parse's columns do.
			rs := export.NewResolver(h)
			return func(rec trace.Record) bool { return s.keep(i, rs, rec) }
		}
	}
}

// Keep reports whether the record of source src is selected. Metadata
// records (task, iface) always are (the readers need them; whether they
// are printed is theirs to decide), and so are lost records unless types
// or groups leave them out: a selection must not hide that events were
// lost.
func (s *Selector) Keep(src int, rec trace.Record) bool {
	return s.keep(src, nil, rec)
}

// keep is Keep with rs, which has seen the reader's records before rec
// (nil: pid and comm are unknown to expressions).
func (s *Selector) keep(src int, rs *export.Resolver, rec trace.Record) bool {
	name := rec.Type.Name
	if name == "task" || name == "iface" {
		if rs != nil {
			rs.Observe(rec)
		}
		return true
	}
	if name == "lost" && s.types == nil {
		return true
	}
	if s.types != nil && !s.types[name] {
		return false
	}
	if s.opts.Conn != 0 && rec.Conn() != s.opts.Conn {
		return false
	}
	if !s.needTab {
		return true
	}
	st := s.srcs[src]
	if s.opts.Pcap != nil && !st.match[rec.Conn()] {
		// No connection, or one whose addresses were never announced:
		// a network predicate cannot hold.
		return false
	}
	if s.cel != nil {
		return s.cel.MatchExpr(s.celEvent(st, rs, rec))
	}
	return true
}

// celEvent describes rec to a CEL expression as the daemon describes a live
// event (internal/daemon), so that an expression means the same.
func (s *Selector) celEvent(st *srcState, rs *export.Resolver, rec trace.Record) *filter.Event {
	e := &filter.Event{
		Name: rec.Type.Name, TimeNs: rec.Time(), CPU: rec.CPU(), TID: rec.TID(),
		NetNS: rec.NetNS(), Conn: rec.Conn(), Size: rec.Size(), Flags: rec.Flags(), UID: -1,
	}
	if rs != nil {
		e.PID, e.Comm, _ = rs.Task(rec.TID())
	}
	if c := st.conns[rec.Conn()]; c != nil && c.Proto != "" {
		e.HasConn, e.Proto = true, protoNum(c.Proto)
		e.Local = netip.AddrPortFrom(c.Local.Addr().Unmap(), c.Local.Port())
		e.Remote = netip.AddrPortFrom(c.Remote.Addr().Unmap(), c.Remote.Port())
		e.HasOwner, e.OwnerPID, e.OwnerUID, e.OwnerComm = c.PID != 0, c.PID, -1, c.Comm
	}
	data := append([]byte(nil), rec.Data...)
	typ, h := rec.Type, st.header
	e.Fields = func() map[string]any {
		// As the daemon's codec gives them: enums by name, addresses as
		// text (IPv4 unless family is 6), bytes as hex.
		r := trace.Record{Type: typ, Data: data}
		fam, hasFam := r.Uint("family")
		v4 := !hasFam || fam != 6
		m := make(map[string]any, len(typ.Fields))
		for _, f := range typ.Fields {
			switch v := r.Value(f).(type) {
			case uint64:
				if name, ok := h.EnumName(f, v); ok {
					m[f.Name] = name
				} else {
					m[f.Name] = int64(v)
				}
			case int64, string:
				m[f.Name] = v
			case netip.Addr:
				if a, ok := r.Addr(f.Name, v4); ok {
					m[f.Name] = a.String()
				}
			case []byte:
				m[f.Name] = hex.EncodeToString(v)
			}
		}
		return m
	}
	return e
}

// Flags are the selection flags every reader takes, one vocabulary
// (docs/FILTERS.md): --types, --groups, --filter, and the pcap-filter
// expression after the traces.
type Flags struct {
	Types, Groups []string
	Expr          string
	pcap          *pcapfilter.Expr
}

// Register adds --types, --groups and --filter to fs; what selects is
// named by what (events, rows, ...).
func (f *Flags) Register(fs *pflag.FlagSet, what string) {
	fs.StringSliceVar(&f.Types, "types", nil, what+" of these event types only (comma-separated names)")
	fs.StringSliceVar(&f.Groups, "groups", nil, what+" of these event groups only (comma-separated: sock, tcp, sched, ...)")
	fs.StringVar(&f.Expr, "filter", "", what+" for which this CEL expression over the event's fields is true (docs/FILTERS.md)")
}

// RegisterRecordGroups adds --groups (-e) to the flags of a command that
// chooses which groups are recorded (record, daemon): the readers' word
// for groups, with the value event.ParseGroups takes ("default,sched",
// "-ip"). --events, these commands' first name for it, is read as
// --groups, so that scripts written with it keep working; it is not
// listed, since in parse it once meant types.
func RegisterRecordGroups(fs *pflag.FlagSet, p *string, value, usage string) {
	fs.StringVarP(p, "groups", "e", value, usage)
	fs.SetNormalizeFunc(func(_ *pflag.FlagSet, name string) pflag.NormalizedName {
		if name == "events" {
			name = "groups"
		}
		return pflag.NormalizedName(name)
	})
}

// Args splits the command's arguments into traces and the pcap-filter
// expression (SplitArgs), which it parses; it returns the traces.
func (f *Flags) Args(cmd *cobra.Command, args []string) ([]string, error) {
	traces, src := SplitArgs(args, cmd.ArgsLenAtDash())
	if len(traces) == 0 {
		first, _, _ := strings.Cut(src, " ")
		return nil, fmt.Errorf("%s: no such file or directory", first)
	}
	e, err := ParsePcap(src)
	if err != nil {
		return nil, err
	}
	f.pcap = e
	return traces, nil
}

// Apply selects the records of inputs by the flags (and conn, when not
// 0): every reader of inputs sees only those.
func (f *Flags) Apply(inputs []trace.Source, conn uint64) error {
	opts := Options{Pcap: f.pcap, Expr: f.Expr, Types: f.Types, Groups: f.Groups, Conn: conn}
	if !opts.Active() {
		return nil
	}
	s, err := New(inputs, opts)
	if err != nil {
		return err
	}
	s.Apply(inputs)
	return nil
}

// Active reports whether the flags select anything (after Args).
func (f *Flags) Active() bool {
	return Options{Pcap: f.pcap, Expr: f.Expr, Types: f.Types, Groups: f.Groups}.Active()
}

// Live selects records by a CEL expression as they are made, for the
// recorder (magnet record --filter): the same evaluator and the same view
// of an event as the readers', built from the records seen so far instead
// of a first pass over a finished trace. Metadata and control records
// (task, iface, lost, conn_open, conn_close, conn_summary) are always kept,
// so that the trace stays readable and its losses visible.
type Live struct {
	sel *Selector
	st  *srcState
	rs  *export.Resolver
}

// NewLive compiles expr for records of the trace whose header is h.
func NewLive(h *trace.Header, expr string) (*Live, error) {
	f, err := filter.Parse(magnetclient.Filter{Expr: expr}, filter.Options{})
	if err != nil {
		return nil, fmt.Errorf("--filter: %w", err)
	}
	if err := checkFields(expr, []*trace.Header{h}); err != nil {
		return nil, err
	}
	return &Live{
		sel: &Selector{opts: Options{Expr: expr}, headers: []*trace.Header{h}, cel: f, needTab: true},
		st:  &srcState{header: h, conns: map[uint64]*export.Conn{}, match: map[uint64]bool{}},
		rs:  export.NewResolver(h),
	}, nil
}

// Control reports whether records of type name are always kept.
func Control(name string) bool {
	switch name {
	case "task", "iface", "lost", "conn_open", "conn_close", "conn_summary":
		return true
	}
	return false
}

// Keep takes note of rec (a thread's name, a connection's addresses) and
// reports whether it is selected. rec.Data may be reused once Keep
// returns.
func (l *Live) Keep(rec trace.Record) bool {
	if l.rs.Observe(rec) {
		return true
	}
	if id := rec.Conn(); id != 0 {
		c := l.st.conns[id]
		if c == nil {
			c = &export.Conn{ID: id, OpenNs: rec.Time()}
			l.st.conns[id] = c
		}
		c.Observe(l.rs, rec)
	}
	if Control(rec.Type.Name) {
		return true
	}
	return l.sel.cel.MatchExpr(l.sel.celEvent(l.st, l.rs, rec))
}
