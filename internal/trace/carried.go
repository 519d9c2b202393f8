// SPDX-License-Identifier: Apache-2.0

package trace

import (
	"encoding/binary"
	"slices"
	"sort"
)

// Carried returns flagged copies (FlagCarried) of the state a file repeats
// from before its start (a rotated file, a flight recorder's window):
// descriptions (task and iface records) and conn_open records, in time
// order. At one instant a description comes before the connections, since
// a reader resolves a conn_open's owner as it reads it; ties otherwise go
// by type id.
func Carried(descriptions, conns [][]byte) [][]byte {
	type rec struct {
		b    []byte
		conn bool
	}
	all := make([]rec, 0, len(descriptions)+len(conns))
	for _, b := range descriptions {
		all = append(all, rec{b, false})
	}
	for _, b := range conns {
		all = append(all, rec{b, true})
	}
	sort.SliceStable(all, func(i, j int) bool {
		a, b := all[i], all[j]
		if ta, tb := binary.NativeEndian.Uint64(a.b[0:8]), binary.NativeEndian.Uint64(b.b[0:8]); ta != tb {
			return ta < tb
		}
		if a.conn != b.conn {
			return !a.conn
		}
		return a.b[30] < b.b[30]
	})
	out := make([][]byte, len(all))
	for i, r := range all {
		c := slices.Clone(r.b)
		c[31] |= FlagCarried
		out[i] = c
	}
	return out
}
