// SPDX-License-Identifier: Apache-2.0

package filter

import (
	"regexp"
	"strings"
	"sync"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/interpreter"
)

// costLimit bounds one evaluation; a comparison costs about 1, so honest
// expressions stay far below while a macro over a huge list is stopped.
const costLimit = 100_000

var (
	envOnce sync.Once
	env     *cel.Env
	envErr  error
)

// celEnv declares the variables an expression sees (docs/DAEMON.md).
// Numbers are int, so that literals compare without casts.
func celEnv() (*cel.Env, error) {
	envOnce.Do(func() {
		var opts []cel.EnvOption
		for _, name := range []string{"time_ns", "cpu", "tid", "pid", "uid", "netns", "conn", "size", "flags", "lport", "rport"} {
			opts = append(opts, cel.Variable(name, cel.IntType))
		}
		for _, name := range []string{"type", "comm", "proto", "laddr", "raddr"} {
			opts = append(opts, cel.Variable(name, cel.StringType))
		}
		opts = append(opts,
			cel.Variable("owner", cel.MapType(cel.StringType, cel.DynType)),
			cel.Variable("fields", cel.MapType(cel.StringType, cel.DynType)),
			cel.ParserExpressionSizeLimit(MaxExprBytes),
			cel.ParserRecursionLimit(64),
		)
		env, envErr = cel.NewEnv(opts...)
	})
	return env, envErr
}

// fieldRef finds the event fields an expression names: fields.NAME and
// fields["NAME"].
var fieldRef = regexp.MustCompile(`\bfields\s*(?:\.\s*([A-Za-z_][A-Za-z0-9_]*)|\[\s*["']([^"']*)["']\s*\])`)

// FieldRef is an event field an expression names, and the column (from 1)
// where its name starts.
type FieldRef struct {
	Name   string
	Column int
}

// FieldRefs lists the event fields expr names (fields.NAME,
// fields["NAME"]), so that a caller knowing the recording's fields can
// refuse a name no event has.
func FieldRefs(expr string) []FieldRef {
	var refs []FieldRef
	for _, m := range fieldRef.FindAllStringSubmatchIndex(expr, -1) {
		i, j := m[2], m[3]
		if i < 0 {
			i, j = m[4], m[5]
		}
		refs = append(refs, FieldRef{Name: expr[i:j], Column: i + 1})
	}
	return refs
}

type program struct {
	prg cel.Program
}

// maxCompiled bounds the cache of compiled expressions; past it the cache
// starts again (clients choose the expressions: it must not grow forever).
const maxCompiled = 256

var (
	compiledMu sync.Mutex
	compiled   = map[string]*program{}
)

// compile compiles src once however many filters use it, so that filters
// with the same expression share one program (and ExprMemo can tell).
func compile(src string) (*program, error) {
	compiledMu.Lock()
	p := compiled[src]
	compiledMu.Unlock()
	if p != nil {
		return p, nil
	}
	p, err := compileNew(src)
	if err != nil {
		return nil, err
	}
	compiledMu.Lock()
	defer compiledMu.Unlock()
	if q := compiled[src]; q != nil {
		return q, nil
	}
	if len(compiled) >= maxCompiled {
		clear(compiled)
	}
	compiled[src] = p
	return p, nil
}

func compileNew(src string) (*program, error) {
	if len(src) > MaxExprBytes {
		return nil, bad("expr: %d bytes, at most %d", len(src), MaxExprBytes)
	}
	e, err := celEnv()
	if err != nil {
		return nil, err
	}
	ast, iss := e.Compile(src)
	if iss != nil && iss.Err() != nil {
		msg := oneLine(iss.Err().Error())
		if connField.MatchString(src) && strings.Contains(msg, "does not support field selection") {
			// conn is the connection id, as in the daemon's other keys;
			// one may well write conn.rport for the connection's port.
			msg += " (conn is the connection id; the connection's tuple is proto, laddr, lport, raddr, rport)"
		}
		return nil, bad("expr: %s", msg)
	}
	if !ast.OutputType().IsExactType(cel.BoolType) && !ast.OutputType().IsExactType(cel.DynType) {
		return nil, bad("expr: must be true or false, not %s", ast.OutputType())
	}
	prg, err := e.Program(ast, cel.CostLimit(costLimit))
	if err != nil {
		return nil, bad("expr: %s", oneLine(err.Error()))
	}
	return &program{prg: prg}, nil
}

// connField finds a field taken of conn, which is a number.
var connField = regexp.MustCompile(`\bconn\s*\.`)

// celPos is the position CEL puts before its message: line:column.
var celPos = regexp.MustCompile(`^(\d+):(\d+): `)

// oneLine keeps the first line of a CEL error (the next ones draw a caret
// under the expression), its position said as the pcap-filter parser and
// the field check say it: "column N" (with the line when not the first).
func oneLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	s = strings.TrimPrefix(s, "ERROR: <input>:")
	s = strings.Join(strings.Fields(s), " ")
	if m := celPos.FindStringSubmatch(s); m != nil {
		pos := "column " + m[2]
		if m[1] != "1" {
			pos = "line " + m[1] + " column " + m[2]
		}
		s = pos + ": " + s[len(m[0]):]
	}
	return s
}

// MatchExpr evaluates the expression (true when there is none). An
// evaluation that fails (a field the event lacks, the cost limit) does not
// match.
func (f *Filter) MatchExpr(e *Event) bool {
	if f.expr == nil {
		return true
	}
	out, _, err := f.expr.prg.Eval(&activation{e: e})
	if err != nil {
		return false
	}
	b, ok := out.Value().(bool)
	return ok && b
}

// ExprMemo remembers, for one event, the results of the expressions
// already evaluated on it, so that subscriptions sharing an expression
// evaluate it once per event. The zero value is ready; it is safe for
// concurrent use.
type ExprMemo struct {
	mu      sync.Mutex
	n       int
	progs   [4]*program
	results [4]bool
}

// MatchExprMemo is MatchExpr, remembering the result in memo (which must
// belong to e and no other event).
func (f *Filter) MatchExprMemo(e *Event, memo *ExprMemo) bool {
	if f.expr == nil {
		return true
	}
	memo.mu.Lock()
	for i := 0; i < memo.n; i++ {
		if memo.progs[i] == f.expr {
			ok := memo.results[i]
			memo.mu.Unlock()
			return ok
		}
	}
	memo.mu.Unlock()
	// Evaluated outside the lock: two subscriptions may both evaluate it
	// the first time, with the same result.
	ok := f.MatchExpr(e)
	memo.mu.Lock()
	if memo.n < len(memo.progs) {
		memo.progs[memo.n], memo.results[memo.n] = f.expr, ok
		memo.n++
	}
	memo.mu.Unlock()
	return ok
}

// activation resolves the expression's variables from the event, lazily.
type activation struct {
	e      *Event
	fields map[string]any
}

func (a *activation) ResolveName(name string) (any, bool) {
	e := a.e
	switch name {
	case "type":
		return e.Name, true
	case "time_ns":
		return int64(e.TimeNs), true
	case "cpu":
		return int64(e.CPU), true
	case "tid":
		return int64(e.TID), true
	case "pid":
		return int64(e.PID), true
	case "uid":
		return e.UID, true
	case "netns":
		return int64(e.NetNS), true
	case "conn":
		return int64(e.Conn), true
	case "size":
		return int64(e.Size), true
	case "flags":
		return int64(e.Flags), true
	case "comm":
		return e.Comm, true
	case "proto":
		if !e.HasConn {
			return "", true
		}
		switch e.Proto {
		case 6:
			return "tcp", true
		case 17:
			return "udp", true
		}
		return "", true
	case "laddr", "raddr":
		ap := e.Local
		if name == "raddr" {
			ap = e.Remote
		}
		if !e.HasConn || !ap.IsValid() {
			return "", true
		}
		return ap.Addr().Unmap().String(), true
	case "lport":
		return int64(e.Local.Port()), true
	case "rport":
		return int64(e.Remote.Port()), true
	case "owner":
		if !e.HasOwner {
			return map[string]any{"pid": int64(0), "uid": int64(-1), "comm": ""}, true
		}
		return map[string]any{"pid": int64(e.OwnerPID), "uid": e.OwnerUID, "comm": e.OwnerComm}, true
	case "fields":
		if a.fields == nil {
			a.fields = map[string]any{}
			if e.Fields != nil {
				a.fields = e.Fields()
			}
		}
		return a.fields, true
	}
	return nil, false
}

func (a *activation) Parent() interpreter.Activation { return nil }
