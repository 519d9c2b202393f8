// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Keys of the annotation comments of bpf/events.h (its comment above enum
// mg_type describes the syntax).
var (
	typeKeys  = []string{"group", "programs", "hook", "what"}
	groupKeys = []string{"help"}
)

// annotation is the block comment just before an enumerator, as fields.
type annotation struct {
	line   int // the enumerator's, 1-based
	fields map[string]string
}

var (
	keyRE     = regexp.MustCompile(`^([a-z]+):(?:\s+(.*))?$`)
	programRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)
)

// enumAnnotations returns the annotation of each enumerator of enum name in
// src (the raw header, comments kept), by C name. An enumerator with no
// comment before it has an annotation with no fields; which fields it must
// have is for the caller to say. Only block comments may come between an
// enumerator and the comma before it, and at most one.
func enumAnnotations(src, name string, keys []string) (map[string]annotation, error) {
	loc := regexp.MustCompile(`enum\s+` + name + `\s*\{`).FindStringIndex(src)
	if loc == nil {
		return nil, fmt.Errorf("no enum %s", name)
	}
	lineAt := func(pos int) int { return strings.Count(src[:pos], "\n") + 1 }
	out := map[string]annotation{}
	var (
		comments  [][2]int // the block comments since the last comma: where their bodies start and end
		itemStart = -1
	)
	for i := loc[1]; i < len(src); i++ {
		switch {
		case strings.HasPrefix(src[i:], "/*"):
			end := strings.Index(src[i+2:], "*/")
			if end < 0 {
				return nil, fmt.Errorf("line %d: unterminated comment", lineAt(i))
			}
			if itemStart < 0 {
				comments = append(comments, [2]int{i + 2, i + 2 + end})
			}
			i += 2 + end + 1
		case strings.HasPrefix(src[i:], "//"):
			return nil, fmt.Errorf("line %d: enum %s: a // comment; annotations are block comments", lineAt(i), name)
		case src[i] == ',' || src[i] == '}':
			if itemStart >= 0 {
				item := strings.TrimSpace(src[itemStart:i])
				c := strings.Fields(strings.SplitN(item, "=", 2)[0])
				if len(c) != 1 {
					return nil, fmt.Errorf("line %d: enum %s: %q: want NAME = VALUE", lineAt(itemStart), name, item)
				}
				a := annotation{line: lineAt(itemStart), fields: map[string]string{}}
				if len(comments) > 1 {
					return nil, fmt.Errorf("line %d: %s: %d comments before it, want one annotation", a.line, c[0], len(comments))
				}
				if len(comments) == 1 {
					body := src[comments[0][0]:comments[0][1]]
					fields, err := parseAnnotation(body, lineAt(comments[0][0]), c[0], keys)
					if err != nil {
						return nil, err
					}
					a.fields = fields
				}
				out[c[0]] = a
			}
			if src[i] == '}' {
				return out, nil
			}
			comments, itemStart = nil, -1
		case itemStart < 0 && !isSpace(src[i]):
			itemStart = i
		}
	}
	return nil, fmt.Errorf("enum %s: no closing brace", name)
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// parseAnnotation reads the fields of a block comment's body (between /*
// and */), which starts on line first and annotates enumerator c:
// "key: value" lines, each continued by the lines indented further than it.
func parseAnnotation(body string, first int, c string, keys []string) (map[string]string, error) {
	fields := map[string]string{}
	key, indent := "", -1
	for n, l := range strings.Split(body, "\n") {
		line := first + n
		if n > 0 {
			l = strings.TrimLeft(l, " \t")
			l = strings.TrimPrefix(l, "*")
		}
		text := strings.TrimLeft(l, " \t")
		text = strings.TrimRight(text, " \t")
		if text == "" {
			continue
		}
		in := len(l) - len(strings.TrimLeft(l, " \t"))
		if key != "" && in > indent {
			fields[key] += " " + text
			continue
		}
		m := keyRE.FindStringSubmatch(text)
		if m == nil || !slices.Contains(keys, m[1]) {
			return nil, fmt.Errorf("line %d: %s: %q: want a field, KEY: VALUE with KEY one of %s (a longer value continues on lines indented further)", line, c, text, strings.Join(keys, ", "))
		}
		if _, dup := fields[m[1]]; dup {
			return nil, fmt.Errorf("line %d: %s: %s: given twice", line, c, m[1])
		}
		key, indent = m[1], in
		fields[key] = m[2]
	}
	for _, k := range keys {
		if strings.TrimSpace(fields[k]) == "" {
			return nil, fmt.Errorf("line %d: %s: no %s: field (want %s)", first, c, k, strings.Join(keys, ", "))
		}
	}
	return fields, nil
}

// entry is one event type's catalogue entry.
type entry struct {
	enumerator
	group    enumerator
	programs []string
	hook     string
	what     string
}

// catalogue checks the annotations of enum mg_type and enum mg_group and
// returns the event types' entries (id order) and the groups' help (the
// groups' order).
func (h *header) catalogue(types []enumerator) ([]entry, []string, error) {
	groupAnn, err := enumAnnotations(h.src, "mg_group", groupKeys)
	if err != nil {
		return nil, nil, err
	}
	var help []string
	for _, g := range h.groups {
		a := groupAnn[g.c]
		if a.fields["help"] == "" {
			return nil, nil, fmt.Errorf("line %d: %s: no annotation (want /* help: ... */ before it)", a.line, g.c)
		}
		help = append(help, a.fields["help"])
	}
	typeAnn, err := enumAnnotations(h.src, "mg_type", typeKeys)
	if err != nil {
		return nil, nil, err
	}
	var out []entry
	for _, t := range types {
		a := typeAnn[t.c]
		if len(a.fields) == 0 {
			return nil, nil, fmt.Errorf("line %d: %s: no annotation (want a comment of %s before it)", a.line, t.c, strings.Join(typeKeys, ", "))
		}
		e := entry{enumerator: t, hook: a.fields["hook"], what: a.fields["what"]}
		gi := slices.IndexFunc(h.groups, func(g enumerator) bool { return groupName(g.c) == a.fields["group"] })
		if gi < 0 {
			var names []string
			for _, g := range h.groups {
				names = append(names, groupName(g.c))
			}
			return nil, nil, fmt.Errorf("line %d: %s: group %q is not in enum mg_group (want one of %s)", a.line, t.c, a.fields["group"], strings.Join(names, ", "))
		}
		e.group = h.groups[gi]
		if p := a.fields["programs"]; p != "none" {
			for _, prog := range strings.Split(p, ",") {
				prog = strings.TrimSpace(prog)
				if !programRE.MatchString(prog) || slices.Contains(e.programs, prog) {
					return nil, nil, fmt.Errorf("line %d: %s: programs %q: want distinct program names separated by commas, or none", a.line, t.c, p)
				}
				e.programs = append(e.programs, prog)
			}
		}
		out = append(out, e)
	}
	return out, help, nil
}

// groupName is a group's name for --events: MG_G_TCPSTATE → tcpstate.
func groupName(c string) string { return strings.ToLower(strings.TrimPrefix(c, "MG_G_")) }

// eventName is an event type's name: MG_TCP_XMIT → tcp_xmit.
func eventName(c string) string { return strings.ToLower(strings.TrimPrefix(c, "MG_")) }

// hookEvents lists, for each program named in the catalogue, the events it
// writes: first those it is named first for (its own), then those another
// program is named first for, each part in id order, so that `magnet
// status` reads "what this hook is for, then what it also gives".
func hookEvents(entries []entry) map[string][]string {
	own, also := map[string][]string{}, map[string][]string{}
	for _, e := range entries {
		for i, p := range e.programs {
			if i == 0 {
				own[p] = append(own[p], eventName(e.c))
			} else {
				also[p] = append(also[p], eventName(e.c))
			}
		}
	}
	out := map[string][]string{}
	for p, evs := range own {
		out[p] = evs
	}
	for p, evs := range also {
		out[p] = append(out[p], evs...)
	}
	return out
}
