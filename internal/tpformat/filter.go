// SPDX-License-Identifier: Apache-2.0

package tpformat

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxPredicates bounds the tests of one filter: the BPF program checks
// them in a loop of that many rounds.
const MaxPredicates = 8

// Op is a comparison of a filter.
type Op uint8

// The operators, numbered as enum kev_op in bpf/kevent.h.
const (
	OpEq  Op = 1
	OpNe  Op = 2
	OpLt  Op = 3
	OpLe  Op = 4
	OpGt  Op = 5
	OpGe  Op = 6
	OpAnd Op = 7 // (field & value) != 0
)

var opNames = []struct {
	s  string
	op Op
}{
	// Two-character operators first, so that "<=" is not read as "<".
	{"==", OpEq}, {"!=", OpNe}, {"<=", OpLe}, {">=", OpGe}, {"<", OpLt}, {">", OpGt}, {"&", OpAnd},
}

// Predicate is one test "field OP value" of a filter.
type Predicate struct {
	Field Field
	Op    Op
	Value uint64 // a negative value of a signed field in two's complement
	// NewTerm starts another conjunction: the filter passes when all the
	// predicates of any one conjunction do.
	NewTerm bool
}

// ParseFilter compiles a filter on f's fields, in the tracefs filter
// syntax's simple form: tests "FIELD OP NUMBER" (OP one of == != < <= > >=
// &) joined by && and ||, && binding tighter, without parentheses. Only
// integer fields can be tested.
func ParseFilter(f *Format, expr string) ([]Predicate, error) {
	expr = strings.TrimSpace(expr)
	if expr == "" {
		return nil, nil
	}
	if strings.ContainsAny(expr, "()") {
		return nil, fmt.Errorf("filter %q: parentheses are not supported (write it as ORs of ANDs)", clip(expr))
	}
	var out []Predicate
	for ti, term := range strings.Split(expr, "||") {
		for pi, test := range strings.Split(term, "&&") {
			p, err := parsePredicate(f, strings.TrimSpace(test))
			if err != nil {
				return nil, fmt.Errorf("filter %q: %w", clip(expr), err)
			}
			p.NewTerm = ti > 0 && pi == 0
			out = append(out, p)
			if len(out) > MaxPredicates {
				return nil, fmt.Errorf("filter %q: more than %d tests", clip(expr), MaxPredicates)
			}
		}
	}
	return out, nil
}

func parsePredicate(f *Format, s string) (Predicate, error) {
	var p Predicate
	if s == "" {
		return p, fmt.Errorf("an empty test")
	}
	at, op := -1, Op(0)
	var opText string
	for i := 0; i < len(s) && at < 0; i++ {
		for _, o := range opNames {
			if strings.HasPrefix(s[i:], o.s) {
				at, op, opText = i, o.op, o.s
				break
			}
		}
	}
	if at < 0 {
		return p, fmt.Errorf("test %q: no operator (want one of == != < <= > >= &)", clip(s))
	}
	name := strings.TrimSpace(s[:at])
	val := strings.TrimSpace(s[at+len(opText):])
	fl, ok := f.Field(name)
	if !ok {
		var names []string
		for _, x := range f.Fields {
			names = append(names, x.Name)
		}
		return p, fmt.Errorf("%s:%s has no field %q (fields: %s)", f.System, f.Name, clip(name), strings.Join(names, ", "))
	}
	if !fl.Integer() || fl.Pointer() {
		return p, fmt.Errorf("field %s (%s) cannot be tested: only integer fields can", fl.Name, fl.CType)
	}
	v, err := parseValue(val, fl)
	if err != nil {
		return p, fmt.Errorf("test %q: %w", clip(s), err)
	}
	return Predicate{Field: fl, Op: op, Value: v}, nil
}

// parseValue parses a decimal, hexadecimal (0x) or octal (0) number that
// fits field fl.
func parseValue(s string, fl Field) (uint64, error) {
	if s == "" {
		return 0, fmt.Errorf("no value")
	}
	bits := 8 * fl.Size
	if strings.HasPrefix(s, "-") {
		if !fl.Signed {
			return 0, fmt.Errorf("%s is unsigned: %q cannot match", fl.Name, clip(s))
		}
		n, err := strconv.ParseInt(s, 0, bits)
		if err != nil {
			return 0, fmt.Errorf("%q is not a %d-bit number", clip(s), bits)
		}
		return uint64(n), nil
	}
	if fl.Signed {
		n, err := strconv.ParseInt(s, 0, bits)
		if err != nil {
			return 0, fmt.Errorf("%q is not a %d-bit signed number", clip(s), bits)
		}
		return uint64(n), nil
	}
	n, err := strconv.ParseUint(s, 0, bits)
	if err != nil {
		return 0, fmt.Errorf("%q is not a %d-bit number", clip(s), bits)
	}
	return n, nil
}

// Match evaluates the filter on a raw tracepoint record in the machine's
// byte order, as the BPF program does: for tests and for checking a trace.
func Match(preds []Predicate, raw []byte, order interface {
	Uint16([]byte) uint16
	Uint32([]byte) uint32
	Uint64([]byte) uint64
}) bool {
	if len(preds) == 0 {
		return true
	}
	anyTerm, term := false, true
	for i, p := range preds {
		if p.NewTerm && i > 0 {
			anyTerm = anyTerm || term
			term = true
		}
		fl := p.Field
		if fl.Offset+fl.Size > len(raw) {
			term = false
			continue
		}
		b := raw[fl.Offset : fl.Offset+fl.Size]
		var v uint64
		switch fl.Size {
		case 1:
			v = uint64(b[0])
			if fl.Signed {
				v = uint64(int64(int8(b[0])))
			}
		case 2:
			v = uint64(order.Uint16(b))
			if fl.Signed {
				v = uint64(int64(int16(v)))
			}
		case 4:
			v = uint64(order.Uint32(b))
			if fl.Signed {
				v = uint64(int64(int32(v)))
			}
		default:
			v = order.Uint64(b)
		}
		term = term && test(v, p.Op, p.Value, fl.Signed)
	}
	return anyTerm || term
}

func test(v uint64, op Op, c uint64, signed bool) bool {
	sv, sc := int64(v), int64(c)
	switch op {
	case OpEq:
		return v == c
	case OpNe:
		return v != c
	case OpLt:
		if signed {
			return sv < sc
		}
		return v < c
	case OpLe:
		if signed {
			return sv <= sc
		}
		return v <= c
	case OpGt:
		if signed {
			return sv > sc
		}
		return v > c
	case OpGe:
		if signed {
			return sv >= sc
		}
		return v >= c
	case OpAnd:
		return v&c != 0
	}
	return false
}
