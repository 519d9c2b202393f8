// SPDX-License-Identifier: Apache-2.0

package analyze

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/magnet-tracer/magnet/internal/trace"
)

// kernelMark is a kernel event chosen at run time (a tracepoint, uprobe,
// USDT probe), for the Perfetto timeline: on a track per CPU of its trace,
// an instant with its fields as arguments, or, for the irq group's entries
// and exits, the beginning and end of a slice.
type kernelMark struct {
	t    uint64
	src  int
	cpu  uint16
	ph   byte // 'i', 'B' or 'E'
	name string
	args map[string]any
}

// firstKernelID is the smallest type id of a kernel event chosen at run
// time (kevent.FirstID), whose records analyze knows only through the
// dictionary.
const firstKernelID = 64

func kernelMarkOf(src *source, rec trace.Record) (kernelMark, bool) {
	t := rec.Type
	if t == nil || t.ID < firstKernelID {
		return kernelMark{}, false
	}
	m := kernelMark{t: uint64(max(int64(rec.Time())+src.offset, 0)), src: src.index, cpu: rec.CPU(), ph: 'i', name: t.Name, args: map[string]any{}}
	for _, f := range t.Fields {
		v := rec.Value(f)
		if b, ok := v.([]byte); ok {
			v = fmt.Sprintf("%x", b)
		}
		m.args[f.Name] = v
	}
	if t.Group == "irq" {
		what := ""
		if v, ok := m.args["vec"]; ok {
			what = map[uint64]string{2: "NET_TX", 3: "NET_RX"}[toU64(v)]
			if what == "" {
				what = fmt.Sprintf("softirq %v", v)
			}
		} else if v, ok := m.args["irq"]; ok {
			what = fmt.Sprintf("irq %v", v)
		}
		switch {
		case strings.HasSuffix(t.Name, "_entry"):
			m.ph, m.name = 'B', what
		case strings.HasSuffix(t.Name, "_exit"):
			m.ph, m.name = 'E', what
		}
	}
	return m, true
}

func toU64(v any) uint64 {
	switch x := v.(type) {
	case uint64:
		return x
	case int64:
		return uint64(x)
	}
	return 0
}

// kernelMarks writes the kernel events, each CPU of each trace a track.
func (p *perfettoWriter) kernelMarks(ms []kernelMark) {
	tids := map[[2]int]int{}
	// Times count from the first connection event, as the rest of the
	// timeline does (earlier kernel events are negative); without any,
	// from the first kernel event.
	for _, m := range ms {
		if !p.started || m.t < p.start && !p.connEvents {
			p.start, p.started = m.t, true
		}
	}
	for _, m := range ms {
		k := [2]int{m.src, int(m.cpu)}
		tid, ok := tids[k]
		if !ok {
			tid = 1<<20 + len(tids)
			tids[k] = tid
			p.meta(map[string]any{"ph": "M", "name": "thread_name", "pid": m.src + 1, "tid": tid,
				"args": map[string]any{"name": fmt.Sprintf("kernel events, CPU %d", m.cpu)}})
		}
		args, err := json.Marshal(m.args)
		if err != nil {
			p.err = err
			return
		}
		name, _ := json.Marshal(m.name)
		b := append(p.buf[:0], `{"ph":"`...)
		b = append(b, m.ph)
		b = append(b, '"')
		if m.ph == 'i' {
			b = append(b, `,"s":"t"`...)
		}
		b = append(b, `,"name":`...)
		b = append(b, name...)
		b = append(b, fmt.Sprintf(`,"pid":%d,"tid":%d,"ts":`, m.src+1, tid)...)
		b = p.appendUs(b, m.t)
		b = append(b, `,"args":`...)
		b = append(b, args...)
		b = append(b, '}')
		p.emit(b)
	}
}

// KernelEventCounts is what a trace holds of the kernel events chosen at
// run time, for the report: each event type's records, in the order of
// the trace's dictionary (the order they were asked for).
type KernelEventCounts struct {
	Trace  string             `json:"trace"`
	Events []KernelEventCount `json:"events"`
}

// KernelEventCount is one kernel event type's records in a trace.
type KernelEventCount struct {
	Name    string `json:"name"`
	Group   string `json:"group"`
	Records uint64 `json:"records"`
}

func kernelEventCounts(path string, h *trace.Header, n map[string]uint64) *KernelEventCounts {
	kc := &KernelEventCounts{Trace: path}
	for _, t := range h.Types {
		if t.ID >= firstKernelID {
			kc.Events = append(kc.Events, KernelEventCount{Name: t.Name, Group: t.Group, Records: n[t.Name]})
		}
	}
	return kc
}
