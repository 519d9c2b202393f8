// SPDX-License-Identifier: Apache-2.0

package event_test

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/event"
)

// eventsDoc is docs/EVENTS.md, which describes what events.h and the
// catalogue define: these tests keep the two from drifting apart, since
// adding or changing an event touches both.
func eventsDoc(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../docs/EVENTS.md")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestEventsDocQuickReference: the quick reference has one row per
// catalogued event with its id, group, C struct and size in the trace.
func TestEventsDocQuickReference(t *testing.T) {
	doc := eventsDoc(t)
	sizes := map[string]int{}
	for _, et := range dictionary(t) {
		sizes[et.Name] = int(et.Size)
	}
	row := regexp.MustCompile("(?m)^\\| (\\d+) \\| `([a-z_]+)` \\| ([a-z]+)[^|]* \\|.*\\| `(mg_[a-z_]+)` \\| (\\d+) \\|$")
	rows := map[string][]string{}
	for _, m := range row.FindAllStringSubmatch(doc, -1) {
		rows[m[2]] = m
	}
	for _, in := range event.Catalogue {
		m, ok := rows[in.Name]
		if !ok {
			t.Errorf("EVENTS.md's quick reference has no row for %s", in.Name)
			continue
		}
		if id, _ := strconv.Atoi(m[1]); id != int(in.Type) {
			t.Errorf("%s: id %d in EVENTS.md, %d in events.h", in.Name, id, in.Type)
		}
		if m[3] != in.Group.String() {
			t.Errorf("%s: group %s in EVENTS.md, %s in the catalogue", in.Name, m[3], in.Group)
		}
		if n, _ := strconv.Atoi(m[5]); n != sizes[in.Name] {
			t.Errorf("%s: %d bytes in EVENTS.md, %d in the dictionary", in.Name, n, sizes[in.Name])
		}
		delete(rows, in.Name)
	}
	for name := range rows {
		t.Errorf("EVENTS.md's quick reference has a row for %s, which the catalogue lacks", name)
	}
}

// TestEventsDocGroups: the groups table gives each group its bit and
// says which are recorded by default.
func TestEventsDocGroups(t *testing.T) {
	doc := eventsDoc(t)
	row := regexp.MustCompile("(?m)^\\| `([a-z]+)` \\| (0x[0-9a-f]+) \\|.*\\| ([^|]+) \\|$")
	seen := 0
	for _, m := range row.FindAllStringSubmatch(doc, -1) {
		g, err := event.ParseGroups(m[1])
		if err != nil {
			t.Errorf("EVENTS.md names group %s: %v", m[1], err)
			continue
		}
		g &^= event.GroupConn // ParseGroups always adds conn
		if m[1] == "conn" {
			g = event.GroupConn
		}
		seen++
		if bit, _ := strconv.ParseUint(m[2], 0, 32); event.Group(bit) != g {
			t.Errorf("group %s: bit %s in EVENTS.md, %#x in events.h", m[1], m[2], uint32(g))
		}
		def := strings.HasPrefix(m[3], "yes") || strings.HasPrefix(m[3], "always")
		if want := event.DefaultGroups&g != 0; def != want {
			t.Errorf("group %s: EVENTS.md says %q, recorded by default: %v", m[1], m[3], want)
		}
	}
	if seen != len(event.GroupNames())-2 { // less default and all
		t.Errorf("EVENTS.md's groups table has %d groups, the catalogue %d", seen, len(event.GroupNames())-2)
	}
}

// TestEventsDocFields: each event's section in EVENTS.md names every field
// the dictionary gives it (an array's fields, name_0 ... name_N, by its
// first; lost's n_<type> by that pattern).
func TestEventsDocFields(t *testing.T) {
	doc := eventsDoc(t)
	heading := regexp.MustCompile("(?m)^### (.*)$")
	sections := map[string]string{}
	hs := heading.FindAllStringSubmatchIndex(doc, -1)
	for i, h := range hs {
		end := len(doc)
		if i+1 < len(hs) {
			end = hs[i+1][0]
		}
		if j := strings.Index(doc[h[1]:end], "\n## "); j >= 0 {
			end = h[1] + j
		}
		for _, m := range regexp.MustCompile("`([a-z_]+)` \\((\\d+)\\)").FindAllStringSubmatch(doc[h[2]:h[3]], -1) {
			sections[m[1]] = doc[h[0]:end]
		}
	}
	indexed := regexp.MustCompile(`^(.+)_\d+$`)
	for _, et := range dictionary(t) {
		sec, ok := sections[et.Name]
		if !ok {
			t.Errorf("EVENTS.md has no section for %s", et.Name)
			continue
		}
		for _, f := range et.Fields {
			name := "`" + f.Name + "`"
			if m := indexed.FindStringSubmatch(f.Name); m != nil {
				name = "`" + m[1] + "_0`"
			}
			if strings.HasPrefix(f.Name, "n_") && et.Name == "lost" {
				name = "`n_<type>`"
			}
			if !strings.Contains(sec, name) {
				t.Errorf("EVENTS.md's section of %s does not name its field %s", et.Name, f.Name)
			}
		}
	}
}
