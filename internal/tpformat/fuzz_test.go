// SPDX-License-Identifier: Apache-2.0

package tpformat

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

// FuzzFormat feeds the format parser and the filter compiler arbitrary
// text: either an error or a format whose fields lie after the common ones
// and whose filters can be evaluated on a record of its size.
func FuzzFormat(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.format")
	for _, file := range files {
		b, _ := os.ReadFile(file)
		f.Add(b, "work > 0 && budget == 64 || vec == 3")
	}
	f.Add([]byte("name: x\nID: 1\nformat:\n\tfield:__rel_loc u8[] d;\toffset:8;\tsize:4;\tsigned:0;\n"), "d == 1")
	f.Fuzz(func(t *testing.T, text []byte, filter string) {
		fm, err := Parse("", "", text)
		if err != nil {
			return
		}
		for _, fl := range fm.Fields {
			if fl.Offset < CommonSize || fl.Name == "" || fl.DataLoc && fl.Size != 4 {
				t.Fatalf("field %+v", fl)
			}
		}
		preds, err := ParseFilter(fm, filter)
		if err != nil {
			return
		}
		if len(preds) > MaxPredicates {
			t.Fatalf("%d predicates", len(preds))
		}
		for _, p := range preds {
			if !p.Field.Integer() {
				t.Fatalf("predicate on %+v", p.Field)
			}
		}
		Match(preds, make([]byte, fm.Size()), binary.NativeEndian)
	})
}
