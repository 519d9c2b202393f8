// SPDX-License-Identifier: Apache-2.0

// Package event is magnet's event catalogue: every event type's id, name,
// group, the kernel hook it comes from and what it measures. All of it is
// written once, in bpf/events.h: the ids and groups in its enums, the rest in
// the annotation comment before each enumerator, from which tools/genevents
// generates types_gen.go and catalogue_gen.go (Catalogue, the groups' names
// and help). The binary layouts come from the same header through the Go
// types bpf2go generates; this package only names and describes them.
package event

import (
	"fmt"
	"sort"
	"strings"
)

// Type is an event type id, as in enum mg_type of bpf/events.h. The
// constants, and the groups', are generated from it (types_gen.go).
type Type uint8

// Group is a set of event types enabled together (enum mg_group).
type Group uint32

// DefaultGroups is what `magnet record` records without --events: the
// socket, TCP and device layers, connection lifecycle, TCP state and drops.
// tcp_send is not in it: it comes once per skb a send call fills (3 per 64
// KiB send), from the costliest program, run in the sender's process under
// the socket lock, and says little that sock_send and tcp_xmit do not. ip
// is not in it either: the device events carry the IP header's facts (id,
// TTL, TOS, protocol) and the TCP sequence number, and the ip group's
// cgroup_skb programs run for every packet of every cgroup, two runs and
// two records per packet for a time stamp between TCP and the device.
const DefaultGroups = GroupSock | GroupTCP | GroupTCPState | GroupDev | GroupDrop | GroupConn

// ParseGroups parses a comma-separated --events value. "default" stands for
// DefaultGroups and "all" for every group; a leading "-" removes a group
// ("default,-dev"). Connection lifecycle is always included, because every
// other event needs it to be attributed.
func ParseGroups(s string) (Group, error) {
	var g Group
	if strings.TrimSpace(s) == "" {
		return DefaultGroups, nil
	}
	// A list that starts by removing a group ("-dev") removes it from the
	// default set, as perf and bpftrace users expect.
	if strings.HasPrefix(strings.TrimSpace(s), "-") {
		g = DefaultGroups
	}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		remove := strings.HasPrefix(part, "-")
		part = strings.TrimPrefix(part, "-")
		var v Group
		switch part {
		case "default":
			v = DefaultGroups
		case "all":
			v = AllGroups()
		default:
			found := false
			for _, gn := range groupNames {
				if gn.name == part {
					v, found = gn.g, true
				}
			}
			if !found {
				return 0, fmt.Errorf("unknown event group %q (want %s)", part, strings.Join(GroupNames(), ", "))
			}
		}
		if remove {
			g &^= v
		} else {
			g |= v
		}
	}
	return g | GroupConn, nil
}

// AllGroups returns every group of events the BPF programs write:
// summary is not one (its records come from the recorder in summary
// mode, `record --summary`).
func AllGroups() Group {
	var g Group
	for _, gn := range groupNames {
		g |= gn.g
	}
	return g &^ GroupSummary
}

// GroupNames lists the group names accepted by ParseGroups.
func GroupNames() []string {
	var out []string
	for _, gn := range groupNames {
		out = append(out, gn.name)
	}
	return append(out, "default", "all")
}

// GroupHelp describes each group, one per line, for --help.
func GroupHelp() string {
	var b strings.Builder
	for _, gn := range groupNames {
		fmt.Fprintf(&b, "  %-9s %s\n", gn.name, gn.help)
	}
	return b.String()
}

// Names returns the names of the groups in g.
func (g Group) Names() []string {
	var out []string
	for _, gn := range groupNames {
		if g&gn.g != 0 {
			out = append(out, gn.name)
		}
	}
	return out
}

// String joins the group names with commas.
func (g Group) String() string { return strings.Join(g.Names(), ",") }

// Info describes one event type.
type Info struct {
	Type  Type
	Name  string
	Group Group
	// Hook is the kernel hook that produces it; Measures says what it means.
	Hook     string
	Measures string
}

// ByType returns the catalogue entry of t.
func ByType(t Type) (Info, bool) {
	for _, in := range Catalogue {
		if in.Type == t {
			return in, true
		}
	}
	return Info{}, false
}

// ByName returns the catalogue entry named name.
func ByName(name string) (Info, bool) {
	for _, in := range Catalogue {
		if in.Name == name {
			return in, true
		}
	}
	return Info{}, false
}

// TypesIn returns the event types of the groups in g, sorted by id.
func TypesIn(g Group) []Type {
	var out []Type
	for _, in := range Catalogue {
		if in.Group&g != 0 {
			out = append(out, in.Type)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
