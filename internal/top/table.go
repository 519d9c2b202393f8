// SPDX-License-Identifier: Apache-2.0

// Package top is the model and the drawing of `magnet top`: a table of the
// connections the daemon tracks, one row each, with the application's and
// the wire's rate, the kernel's delivery-rate estimate, cwnd, srtt,
// retransmissions and drops, sortable by any column. Rendering is pure
// (rows in, lines out) so it is tested without a terminal; Run drives it
// from a daemon and a keyboard.
package top

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// Row is one connection as the table shows it.
type Row struct {
	ID     uint64
	PID    uint32
	Comm   string
	Proto  string
	Local  string
	Remote string
	State  string // TCP state, "closed" once the daemon saw it close, "" unknown

	// Rates in bits per second over the daemon's time window, both
	// directions added: a bulk transfer moves one way, and its ACKs are
	// counted at the wire.
	AppBPS  float64
	WireBPS float64
	// DeliveryBPS is the kernel's delivery-rate estimate: the mean of the
	// per-ACK samples (tcp_rate) over the window that the application did
	// not limit, else the last sample (tcp_rate, or tcp_state without
	// per-ACK samples); AppLimited marks a sample taken while the
	// application limited sending.
	DeliveryBPS float64
	AppLimited  bool

	HasTCP  bool // Cwnd and SrttUs are known
	Cwnd    uint32
	SrttUs  uint32
	Lost    uint32 // segments lost (the kernel's estimate, tcp_state)
	Retrans uint64 // tcp_retrans events
	Drops   uint64 // drop events attributed to the connection
}

// RowOf turns a connection of the daemon's API into a row.
func RowOf(c magnetclient.Connection) Row {
	r := Row{
		ID:      c.ID,
		Proto:   c.Proto,
		Local:   c.Local,
		Remote:  c.Remote,
		AppBPS:  c.App.Send.ByTime.BPS + c.App.Recv.ByTime.BPS,
		WireBPS: c.Wire.Send.ByTime.BPS + c.Wire.Recv.ByTime.BPS,
		Retrans: c.Retransmits.Count,
		Drops:   c.Drops.Count,
	}
	if c.Owner != nil {
		r.PID, r.Comm = c.Owner.PID, c.Owner.Comm
	}
	if s := c.State; s != nil {
		r.HasTCP = true
		r.State = s.State
		r.Cwnd, r.SrttUs = s.Cwnd, s.SrttUs
		r.DeliveryBPS, r.AppLimited = s.DeliveryRateBPS, s.DeliveryAppLimited
		r.Lost = s.Lost
	}
	if d := c.Delivery; d != nil {
		r.HasTCP = r.HasTCP || c.State != nil
		if d.Window.Samples > 0 {
			r.DeliveryBPS, r.AppLimited = d.Window.MeanBPS, false
		} else {
			r.DeliveryBPS, r.AppLimited = d.Last.BPS, d.Last.AppLimited
		}
	}
	if c.CloseNs != 0 {
		r.State = "closed"
	}
	return r
}

// Column is one column of the table.
type Column struct {
	Name  string // header, also the --sort name (case-insensitive)
	Right bool   // right-aligned: numbers
	text  func(Row) string
	less  func(a, b Row) int // ascending order
}

// Columns are the table's columns, left to right.
var Columns = []Column{
	{Name: "ID", Right: true, text: func(r Row) string { return strconv.FormatUint(r.ID, 10) },
		less: func(a, b Row) int { return cmp.Compare(a.ID, b.ID) }},
	{Name: "PID", Right: true, text: func(r Row) string { return blankZero(uint64(r.PID)) },
		less: func(a, b Row) int { return cmp.Compare(a.PID, b.PID) }},
	{Name: "COMM", text: func(r Row) string { return r.Comm },
		less: func(a, b Row) int { return strings.Compare(a.Comm, b.Comm) }},
	{Name: "LOCAL", text: func(r Row) string { return r.Local },
		less: func(a, b Row) int { return strings.Compare(a.Local, b.Local) }},
	{Name: "REMOTE", text: func(r Row) string { return r.Remote },
		less: func(a, b Row) int { return strings.Compare(a.Remote, b.Remote) }},
	{Name: "APP", Right: true, text: func(r Row) string { return Rate(r.AppBPS) },
		less: func(a, b Row) int { return cmp.Compare(a.AppBPS, b.AppBPS) }},
	{Name: "WIRE", Right: true, text: func(r Row) string { return Rate(r.WireBPS) },
		less: func(a, b Row) int { return cmp.Compare(a.WireBPS, b.WireBPS) }},
	{Name: "DELIVERY", Right: true, text: deliveryText,
		less: func(a, b Row) int { return cmp.Compare(a.DeliveryBPS, b.DeliveryBPS) }},
	{Name: "CWND", Right: true, text: func(r Row) string { return tcpText(r, uint64(r.Cwnd)) },
		less: func(a, b Row) int { return cmp.Compare(a.Cwnd, b.Cwnd) }},
	{Name: "SRTT", Right: true, text: srttText,
		less: func(a, b Row) int { return cmp.Compare(a.SrttUs, b.SrttUs) }},
	{Name: "RETRANS", Right: true, text: func(r Row) string { return strconv.FormatUint(r.Retrans, 10) },
		less: func(a, b Row) int { return cmp.Compare(a.Retrans, b.Retrans) }},
	{Name: "LOST", Right: true, text: func(r Row) string { return tcpText(r, uint64(r.Lost)) },
		less: func(a, b Row) int { return cmp.Compare(a.Lost, b.Lost) }},
	{Name: "DROPS", Right: true, text: func(r Row) string { return strconv.FormatUint(r.Drops, 10) },
		less: func(a, b Row) int { return cmp.Compare(a.Drops, b.Drops) }},
	{Name: "STATE", text: func(r Row) string { return r.State },
		less: func(a, b Row) int { return strings.Compare(a.State, b.State) }},
}

// ColumnIndex returns the index in Columns of the column named name
// (case-insensitive), or an error listing the names.
func ColumnIndex(name string) (int, error) {
	for i, c := range Columns {
		if strings.EqualFold(c.Name, name) {
			return i, nil
		}
	}
	names := make([]string, len(Columns))
	for i, c := range Columns {
		names[i] = strings.ToLower(c.Name)
	}
	return 0, fmt.Errorf("unknown column %q (want one of %s)", name, strings.Join(names, ", "))
}

// Order is how rows are sorted: by the column Columns[By], descending when
// Desc. Ties are broken by connection id, ascending, so the table does not
// shuffle between refreshes.
type Order struct {
	By   int
	Desc bool
}

// DefaultOrder puts the busiest connection (by application rate) first.
var DefaultOrder = Order{By: 5, Desc: true}

// Sort sorts rows in place.
func (o Order) Sort(rows []Row) {
	less := Columns[o.By].less
	slices.SortStableFunc(rows, func(a, b Row) int {
		c := less(a, b)
		if o.Desc {
			c = -c
		}
		if c == 0 {
			c = cmp.Compare(a.ID, b.ID)
		}
		return c
	})
}

// Next returns the order by the column right of o's (left when step < 0),
// wrapping around. Numeric columns start descending, text ones ascending.
func (o Order) Next(step int) Order {
	n := len(Columns)
	by := ((o.By+step)%n + n) % n
	return Order{By: by, Desc: Columns[by].Right}
}

// Render draws rows (already sorted) as lines of text at most width
// characters wide (0: no limit): a header naming the columns, the sort
// column marked with "v" (descending) or "^" (ascending), then one line per
// row. Columns are as wide as their widest cell; lines that would be wider
// than width are cut.
func Render(rows []Row, o Order, width int) []string {
	cells := make([][]string, len(rows)+1)
	widths := make([]int, len(Columns))
	cells[0] = make([]string, len(Columns))
	for i, c := range Columns {
		h := c.Name
		if i == o.By {
			if o.Desc {
				h += "v"
			} else {
				h += "^"
			}
		}
		cells[0][i] = h
		widths[i] = len(h)
	}
	for ri, r := range rows {
		line := make([]string, len(Columns))
		for i, c := range Columns {
			line[i] = c.text(r)
			widths[i] = max(widths[i], len(line[i]))
		}
		cells[ri+1] = line
	}
	out := make([]string, len(cells))
	var b strings.Builder
	for li, line := range cells {
		b.Reset()
		for i, cell := range line {
			if i > 0 {
				b.WriteString("  ")
			}
			pad := strings.Repeat(" ", widths[i]-len(cell))
			if Columns[i].Right {
				b.WriteString(pad + cell)
			} else if i == len(line)-1 {
				b.WriteString(cell) // no trailing blanks
			} else {
				b.WriteString(cell + pad)
			}
		}
		out[li] = cut(strings.TrimRight(b.String(), " "), width)
	}
	return out
}

// cut shortens s to width bytes (the table is ASCII); 0 means no limit.
func cut(s string, width int) string {
	if width > 0 && len(s) > width {
		return s[:width]
	}
	return s
}

// Rate formats bits per second with an SI prefix: "941.2M", "12.0k", "0".
func Rate(bps float64) string {
	switch {
	case bps <= 0:
		return "0"
	case bps >= 1e9:
		return strconv.FormatFloat(bps/1e9, 'f', 2, 64) + "G"
	case bps >= 1e6:
		return strconv.FormatFloat(bps/1e6, 'f', 1, 64) + "M"
	case bps >= 1e3:
		return strconv.FormatFloat(bps/1e3, 'f', 1, 64) + "k"
	}
	return strconv.FormatFloat(bps, 'f', 0, 64)
}

func deliveryText(r Row) string {
	if !r.HasTCP {
		return "-"
	}
	if r.AppLimited {
		return Rate(r.DeliveryBPS) + "*" // the application, not the network, limited this sample
	}
	return Rate(r.DeliveryBPS) + " " // keeps the digits aligned with starred ones
}

func srttText(r Row) string {
	if !r.HasTCP {
		return "-"
	}
	if r.SrttUs >= 10000 {
		return strconv.FormatFloat(float64(r.SrttUs)/1000, 'f', 1, 64) + "ms"
	}
	return strconv.FormatUint(uint64(r.SrttUs), 10) + "us"
}

func tcpText(r Row, v uint64) string {
	if !r.HasTCP {
		return "-"
	}
	return strconv.FormatUint(v, 10)
}

func blankZero(v uint64) string {
	if v == 0 {
		return "-"
	}
	return strconv.FormatUint(v, 10)
}
