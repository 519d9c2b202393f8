// SPDX-License-Identifier: Apache-2.0

package top

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// Source gives the connections to show, with their figures now.
type Source interface {
	Connections(ctx context.Context) ([]magnetclient.Connection, error)
}

// SourceFunc adapts a function to Source.
type SourceFunc func(ctx context.Context) ([]magnetclient.Connection, error)

// Connections calls f.
func (f SourceFunc) Connections(ctx context.Context) ([]magnetclient.Connection, error) {
	return f(ctx)
}

// Options configure Run.
type Options struct {
	Interval time.Duration     // between refreshes
	Order    Order             // the first sort order
	Size     func() (w, h int) // the terminal's size now; nil or 0 means 80x24
	Where    string            // the daemon's address, shown in the title
	Now      func() time.Time  // the clock of the title; nil means time.Now
	Redraw   <-chan struct{}   // draw again now, e.g. when the terminal was resized
}

// Keys the table understands.
const (
	keyQuit = iota + 1
	keyLeft
	keyRight
	keyReverse
	keyRefresh
)

// Run draws the table on out, a terminal in raw mode, and redraws it every
// o.Interval with fresh figures from src, until ctx ends or the user quits.
// keys is the terminal's input: q (or Ctrl-C) quits, the arrow keys or < and
// > choose the sort column, r reverses the order, space refreshes now. A
// failing source is shown on the status line and retried; it does not end
// Run. Run returns nil when the user quit or ctx ended.
func Run(ctx context.Context, src Source, keys io.Reader, out io.Writer, o Options) error {
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	keyc := make(chan int)
	go readKeys(ctx, keys, keyc)

	type result struct {
		conns []magnetclient.Connection
		err   error
	}
	results := make(chan result, 1)
	fetching := false
	fetch := func() {
		if fetching {
			return
		}
		fetching = true
		go func() {
			fctx, fcancel := context.WithTimeout(ctx, max(o.Interval, 2*time.Second))
			defer fcancel()
			c, err := src.Connections(fctx)
			results <- result{c, err}
		}()
	}

	s := screen{order: o.Order, where: o.Where}
	io.WriteString(out, "\x1b[?1049h\x1b[?25l") // alternate screen, hide cursor
	defer io.WriteString(out, "\x1b[?25h\x1b[?1049l")

	tick := time.NewTicker(o.Interval)
	defer tick.Stop()
	fetch()
	s.draw(out, o)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			fetch()
		case <-o.Redraw:
			s.draw(out, o)
		case r := <-results:
			fetching = false
			if ctx.Err() != nil {
				return nil
			}
			s.err = r.err
			if r.err == nil {
				s.rows = s.rows[:0]
				for _, c := range r.conns {
					s.rows = append(s.rows, RowOf(c))
				}
				s.loaded = true
			}
			s.draw(out, o)
		case k, ok := <-keyc:
			if !ok || k == keyQuit {
				return nil
			}
			switch k {
			case keyLeft:
				s.order = s.order.Next(-1)
			case keyRight:
				s.order = s.order.Next(1)
			case keyReverse:
				s.order.Desc = !s.order.Desc
			case keyRefresh:
				fetch()
			}
			s.draw(out, o)
		}
	}
}

// screen is what Run shows.
type screen struct {
	rows   []Row
	loaded bool // a fetch succeeded at least once
	err    error
	order  Order
	where  string
}

// Frame returns the lines of one screen: a title, a status line, the
// table cut to w columns and h lines.
func (s *screen) frame(w, h int, now time.Time) []string {
	open := 0
	for _, r := range s.rows {
		if r.State != "closed" {
			open++
		}
	}
	dir := "asc"
	if s.order.Desc {
		dir = "desc"
	}
	lines := []string{
		cut(fmt.Sprintf("magnet top  %s  %s  %d connections (%d open)  sort %s %s",
			s.where, now.Format("15:04:05"), len(s.rows), open, Columns[s.order.By].Name, dir), w),
	}
	switch {
	case s.err != nil:
		lines = append(lines, cut("error: "+oneLine(s.err.Error())+" (retrying)", w))
	case !s.loaded:
		lines = append(lines, cut("waiting for the daemon...", w))
	default:
		lines = append(lines, cut("keys: left/right or < > sort column, r reverse, space refresh, q quit", w))
	}
	s.order.Sort(s.rows)
	table := Render(s.rows, s.order, w)
	if room := h - len(lines); room < len(table) {
		table = table[:max(room, 0)]
	}
	return append(lines, table...)
}

func (s *screen) draw(out io.Writer, o Options) {
	w, h := 80, 24
	if o.Size != nil {
		if sw, sh := o.Size(); sw > 0 && sh > 0 {
			w, h = sw, sh
		}
	}
	var b strings.Builder
	b.WriteString("\x1b[H") // home; each line clears its rest, then below
	for i, l := range s.frame(w, h, o.Now()) {
		if i > 0 {
			b.WriteString("\r\n")
		}
		b.WriteString(l)
		b.WriteString("\x1b[K")
	}
	b.WriteString("\x1b[J")
	io.WriteString(out, b.String())
}

// readKeys turns the bytes of a raw terminal into keys, until in ends or
// ctx is done; it closes keyc when in ends.
func readKeys(ctx context.Context, in io.Reader, keyc chan<- int) {
	defer close(keyc)
	buf := make([]byte, 64)
	var pending []byte
	for {
		n, err := in.Read(buf)
		pending = append(pending, buf[:n]...)
		var keys []int
		keys, pending = parseKeys(pending)
		for _, k := range keys {
			select {
			case keyc <- k:
			case <-ctx.Done():
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// parseKeys decodes the keys at the start of b and returns them with the
// bytes left over: an escape sequence not yet complete.
func parseKeys(b []byte) (keys []int, rest []byte) {
	for len(b) > 0 {
		switch c := b[0]; c {
		case 'q', 'Q', 3: // 3: Ctrl-C, which raw mode delivers as a byte
			keys = append(keys, keyQuit)
		case '<', ',', 'h':
			keys = append(keys, keyLeft)
		case '>', '.', 'l':
			keys = append(keys, keyRight)
		case 'r', 'R':
			keys = append(keys, keyReverse)
		case ' ':
			keys = append(keys, keyRefresh)
		case 0x1b:
			if len(b) < 3 {
				if len(b) == 2 && b[1] != '[' && b[1] != 'O' {
					break // a lone escape followed by something else
				}
				return keys, b
			}
			if b[1] == '[' || b[1] == 'O' {
				switch b[2] {
				case 'D':
					keys = append(keys, keyLeft)
				case 'C':
					keys = append(keys, keyRight)
				}
				b = b[3:]
				continue
			}
		}
		b = b[1:]
	}
	return keys, nil
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
