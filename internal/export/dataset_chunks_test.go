// SPDX-License-Identifier: Apache-2.0

package export

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"

	"github.com/magnet-tracer/magnet/internal/tracegen"
)

// The dataset's events files written by the chunkWriter hold what
// parquet-go's column writers wrote before it: the same Parquet schema
// (physical, logical and repetition types), the same row groups, the same
// rows in the same order, and the same statistics, read by parquet-go and
// by DuckDB.
func TestDatasetChunksMatchPerValue(t *testing.T) {
	snd, rcv := writePair(t, t.TempDir(), "s-0000.mgt", "r-0000.mgt", 60000)
	paths := []string{snd, rcv, "../../testdata/bigendian.mgt"}

	type variant struct {
		name      string
		partition []string
		group     int
		page      int
	}
	// With no partition, host and date are columns in the files; a small
	// row group makes several per file, the last one short. The old
	// writer ended a row group only at a multiple of its 8192-row batches
	// (as DatasetRowGroup is), so the bound is one too. Small pages make
	// many per column chunk, cut at any row.
	for _, v := range []variant{{"host,date", []string{"host", "date"}, 0, chunkPage}, {"none", nil, 2 * datasetBatch, 4099}} {
		t.Run(v.name, func(t *testing.T) {
			defer func(p int) { chunkPage = p }(chunkPage)
			chunkPage = v.page
			old, cur := t.TempDir(), t.TempDir()
			for _, d := range []struct {
				dir      string
				perValue bool
			}{{old, true}, {cur, false}} {
				st, err := WriteDataset(d.dir, paths, DatasetOptions{Partition: v.partition, RowGroupRows: v.group, perValue: d.perValue})
				if err != nil || st.Written != len(paths) {
					t.Fatalf("perValue %v: %+v %v", d.perValue, st, err)
				}
			}
			files, err := filepath.Glob(filepath.Join(old, "events", "*", "*", "*.parquet"))
			if len(v.partition) == 0 {
				files, err = filepath.Glob(filepath.Join(old, "events", "*.parquet"))
			}
			if err != nil || len(files) != len(paths) {
				t.Fatalf("%d events files, want %d (%v)", len(files), len(paths), err)
			}
			rows := 0
			for _, f := range files {
				rel, _ := filepath.Rel(old, f)
				want, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				got, err := os.ReadFile(filepath.Join(cur, rel))
				if err != nil {
					t.Fatal(err)
				}
				rows += sameParquet(t, want, got)
				if n := pagesIn(t, got); v.page < chunkPage && n[0] < 2 && len(n) > 0 && len(want) > 100<<10 {
					t.Fatalf("%s: %v pages per column chunk, want small pages", rel, n)
				}
			}
			if rows < 60000 {
				t.Fatalf("%d rows in all, want the recordings' events", rows)
			}
			duckdbSame(t, old, cur, files)
		})
	}
}

// pagesIn is how many pages each column chunk of the first row group of
// the Parquet file data has, most first.
func pagesIn(t *testing.T, data []byte) []int {
	t.Helper()
	f, err := parquet.OpenFile(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, cc := range f.RowGroups()[0].ColumnChunks() {
		pages := cc.Pages()
		n := 0
		for {
			p, err := pages.ReadPage()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			parquet.Release(p)
			n++
		}
		pages.Close()
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b int) int { return b - a })
	return out
}

// duckdbSame compares, with DuckDB, each of files under old with the file
// of the same name under cur: rows either side has that the other lacks
// (0), physical schema, row groups and column statistics.
func duckdbSame(t *testing.T, old, cur string, files []string) {
	if err := exec.Command("python3", "-c", "import duckdb").Run(); err != nil {
		t.Skip("duckdb not installed for python3 (scripts/deps.sh installs it)")
	}
	type pair struct{ Old, Cur string }
	var ps []pair
	for _, f := range files {
		rel, _ := filepath.Rel(old, f)
		ps = append(ps, pair{f, filepath.Join(cur, rel)})
	}
	// Each query returns rows that must be equal for the two files, or a
	// count that must be 0. DuckDB streams the files: nothing is held
	// whole in Python.
	script := `
import duckdb, json, sys
ps = json.load(sys.stdin)
con = duckdb.connect()
# A slow query draws a progress bar on stdout, where the JSON goes.
con.execute("SET enable_progress_bar = false")
con.execute("SET threads = 1")
out = []
def q(sql):
    return [[str(v) for v in r] for r in con.execute(sql).fetchall()]
for p in ps:
    a, b = p["Old"], p["Cur"]
    r = {}
    r["rows"] = [q(f"SELECT count(*) FROM read_parquet('{x}')")[0][0] for x in (a, b)]
    r["only_old"] = q(f"SELECT count(*) FROM (SELECT * FROM read_parquet('{a}') EXCEPT ALL SELECT * FROM read_parquet('{b}'))")[0][0]
    r["only_cur"] = q(f"SELECT count(*) FROM (SELECT * FROM read_parquet('{b}') EXCEPT ALL SELECT * FROM read_parquet('{a}'))")[0][0]
    s = "SELECT name, type, type_length, repetition_type, converted_type, scale, precision, logical_type FROM parquet_schema('%s') ORDER BY name"
    r["schema"] = [q(s % x) for x in (a, b)]
    d = "SELECT column_name, column_type FROM (DESCRIBE SELECT * FROM read_parquet('%s'))"
    r["describe"] = [q(d % x) for x in (a, b)]
    m = "SELECT row_group_id, row_group_num_rows, path_in_schema, type, stats_null_count, stats_min_value, stats_max_value FROM parquet_metadata('%s') ORDER BY row_group_id, path_in_schema"
    r["meta"] = [q(m % x) for x in (a, b)]
    out.append(r)
json.dump(out, sys.stdout)
`
	in, _ := json.Marshal(ps)
	cmd := exec.Command("python3", "-c", script)
	cmd.Stdin = strings.NewReader(string(in))
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("duckdb: %v\n%s", err, ee.Stderr)
		}
		t.Fatal(err)
	}
	var res []struct {
		Rows             []string
		OnlyOld          string `json:"only_old"`
		OnlyCur          string `json:"only_cur"`
		Schema, Describe [][][]string
		Meta             [][][]string
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		name := filepath.Base(ps[i].Old)
		if r.Rows[0] != r.Rows[1] || r.OnlyOld != "0" || r.OnlyCur != "0" {
			t.Errorf("%s: rows %v, %s only in the old file, %s only in the new", name, r.Rows, r.OnlyOld, r.OnlyCur)
		}
		for _, c := range []struct {
			what string
			v    [][][]string
		}{{"parquet schema", r.Schema}, {"DuckDB types", r.Describe}, {"row groups and statistics", r.Meta}} {
			a, _ := json.Marshal(c.v[0])
			b, _ := json.Marshal(c.v[1])
			if string(a) != string(b) {
				t.Errorf("%s: %s differ:\nold %s\nnew %s", name, c.what, a, b)
			}
		}
		t.Logf("%s: %s rows, 0 differ", name, r.Rows[0])
	}
}

// BenchmarkDatasetPerValue is BenchmarkDataset through parquet-go's column
// writers, as before the chunkWriter: run both to compare.
func BenchmarkDatasetPerValue(b *testing.B) {
	tracegen.Bench(b, func(path string) error {
		_, err := WriteDataset(b.TempDir(), []string{path}, DatasetOptions{Partition: []string{"host", "date"}, perValue: true})
		return err
	})
}
