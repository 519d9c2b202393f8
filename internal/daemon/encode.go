// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/live"
)

// streamWriter frames a stream's messages: newline-delimited JSON, one
// object per line with one key naming the message, or server-sent events.
type streamWriter struct {
	w        http.ResponseWriter
	bw       *bufio.Writer
	rc       *http.ResponseController
	sse      bool
	lastPing time.Time
}

func newStreamWriter(w http.ResponseWriter, sse bool) *streamWriter {
	return &streamWriter{w: w, bw: bufio.NewWriterSize(w, 32<<10), rc: http.NewResponseController(w), sse: sse, lastPing: time.Now()}
}

// start sends the answer's header: 200 and the stream's content type.
func (s *streamWriter) start() {
	h := s.w.Header()
	if s.sse {
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
	} else {
		h.Set("Content-Type", "application/x-ndjson")
	}
	h.Set("X-Content-Type-Options", "nosniff")
	s.w.WriteHeader(http.StatusOK)
}

// msg writes one message whose value is the JSON inner, straight into
// the buffer (bufio's error is sticky: the last write reports it).
func (s *streamWriter) msg(name string, inner []byte) error {
	bw := s.bw
	if s.sse {
		bw.WriteString("event: ")
		bw.WriteString(name)
		bw.WriteString("\ndata: ")
		bw.Write(inner)
		_, err := bw.WriteString("\n\n")
		return err
	}
	bw.WriteString(`{"`)
	bw.WriteString(name)
	bw.WriteString(`":`)
	bw.Write(inner)
	_, err := bw.WriteString("}\n")
	return err
}

// msgJSON writes a message whose value is v marshalled.
func (s *streamWriter) msgJSON(name string, v any) error {
	inner, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.msg(name, inner)
}

// ping keeps an idle SSE stream (and proxies in front of it) alive.
func (s *streamWriter) ping() error {
	if !s.sse || time.Since(s.lastPing) < 15*time.Second {
		return nil
	}
	s.lastPing = time.Now()
	if _, err := s.bw.WriteString(": ping\n\n"); err != nil {
		return err
	}
	return s.flush()
}

func (s *streamWriter) flush() error {
	if err := s.bw.Flush(); err != nil {
		return err
	}
	return s.rc.Flush()
}

// appendEvent writes ev as the API's Event object (magnetclient.Event),
// by hand: this runs for every event of every stream.
func appendEvent(b []byte, ev *liveEvent) []byte {
	e := &ev.fe
	b = append(b, `{"time_ns":`...)
	b = strconv.AppendUint(b, e.TimeNs, 10)
	b = append(b, `,"wall_ns":`...)
	b = strconv.AppendInt(b, int64(e.TimeNs)+ev.wallOff, 10)
	b = append(b, `,"type":`...)
	b = appendString(b, e.Name)
	b = append(b, `,"cpu":`...)
	b = strconv.AppendUint(b, uint64(e.CPU), 10)
	b = append(b, `,"pid":`...)
	b = strconv.AppendUint(b, uint64(e.PID), 10)
	b = append(b, `,"tid":`...)
	b = strconv.AppendUint(b, uint64(e.TID), 10)
	b = append(b, `,"comm":`...)
	b = appendString(b, e.Comm)
	b = append(b, `,"netns":`...)
	b = strconv.AppendUint(b, uint64(e.NetNS), 10)
	b = append(b, `,"conn":`...)
	b = strconv.AppendUint(b, e.Conn, 10)
	b = append(b, `,"size":`...)
	b = strconv.AppendInt(b, int64(e.Size), 10)
	if e.Flags != 0 {
		b = append(b, `,"flags":`...)
		b = strconv.AppendUint(b, uint64(e.Flags), 10)
		switch e.Name {
		case "tcp_xmit", "tcp_rcv", "tcp_retrans":
			b = append(b, `,"tcp_flags":`...)
			b = appendString(b, export.TCPFlags(e.Flags))
		}
	}
	if e.HasConn {
		b = append(b, `,"proto":`...)
		b = appendString(b, live.ProtoName(e.Proto))
		b = append(b, `,"local":"`...)
		b = e.Local.AppendTo(b)
		b = append(b, `","remote":"`...)
		b = e.Remote.AppendTo(b)
		b = append(b, '"')
	}
	if e.HasOwner {
		b = append(b, `,"owner":{"pid":`...)
		b = strconv.AppendUint(b, uint64(e.OwnerPID), 10)
		b = append(b, `,"comm":`...)
		b = appendString(b, e.OwnerComm)
		b = append(b, `,"uid":`...)
		b = strconv.AppendInt(b, e.OwnerUID, 10)
		b = append(b, '}')
	}
	b = append(b, `,"fields":{`...)
	b = ev.codec.appendFields(b, ev.raw)
	return append(b, "}}"...)
}

// appendString writes s as a JSON string; bytes that are not UTF-8 become
// U+FFFD (command names are whatever a process set).
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20 || c == 0x7f:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+n]...)
		}
		i += n
	}
	return append(b, '"')
}
