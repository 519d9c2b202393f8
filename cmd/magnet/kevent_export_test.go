// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"bufio"
	"encoding/csv"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// needPyarrow skips a test when pyarrow cannot read Parquet back, and
// fails it on CI, where scripts/deps.sh installs it.
func needPyarrow(t *testing.T) {
	t.Helper()
	if err := exec.Command("python3", "-c", "import pyarrow.parquet").Run(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("pyarrow is missing on CI (scripts/deps.sh installs it): %v", err)
		}
		t.Skip("pyarrow not installed (python3 -m pip install pyarrow)")
	}
}

// parquetRows reads a Parquet file back with pyarrow: every row as a map,
// values as JSON numbers and strings, nulls left out.
func parquetRows(t *testing.T, file string) []map[string]any {
	t.Helper()
	script := `
import json, sys, pyarrow.parquet as pq
for r in pq.read_table(sys.argv[1]).to_pylist():
    print(json.dumps({k: v for k, v in r.items() if v is not None}))
`
	out, err := exec.Command("python3", "-c", script, file).Output()
	if err != nil {
		t.Fatalf("pyarrow %s: %v", file, err)
	}
	return jsonRows(t, string(out))
}

func jsonRows(t *testing.T, s string) []map[string]any {
	t.Helper()
	var rows []map[string]any
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		dec := json.NewDecoder(strings.NewReader(sc.Text()))
		dec.UseNumber()
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			t.Fatalf("json line %q: %v", sc.Text(), err)
		}
		rows = append(rows, m)
	}
	return rows
}

// tableRows exports table of trace tr as format f (tsv, jsonl or
// parquet) to file and reads its rows back as delimitedRows does; parquet
// needs pyarrow (needPyarrow).
func tableRows(t *testing.T, tr, table, f, file string) []map[string]any {
	t.Helper()
	if f == "parquet" {
		needPyarrow(t)
	}
	if r := magnet(t, "export", tr, "--table", table, "-f", f, "-o", file); r.code != 0 {
		t.Fatalf("export %s: %s", f, r.stderr)
	}
	switch f {
	case "tsv":
		return delimitedRows(t, file, '\t')
	case "jsonl":
		return jsonRows(t, readString(t, file))
	case "parquet":
		return parquetRows(t, file)
	}
	t.Fatalf("tableRows: no reader of %s", f)
	return nil
}

// delimitedRows reads a tsv or csv export: every row as a map of its
// non-empty cells.
func delimitedRows(t *testing.T, file string, comma rune) []map[string]any {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := csv.NewReader(f)
	r.Comma = comma
	r.LazyQuotes = true
	recs, err := r.ReadAll()
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var rows []map[string]any
	for _, rec := range recs[1:] {
		m := map[string]any{}
		for i, v := range rec {
			if v != "" {
				m[recs[0][i]] = v
			}
		}
		rows = append(rows, m)
	}
	return rows
}

// TestExportKernelEventFields: a tracepoint chosen at run time shows its
// fields, named as its tracefs format names them, in every format export
// writes events in, with no code for that tracepoint. sh renames itself
// when it executes true (task:task_rename: pid an int, oldcomm and
// newcomm char[16], oom_score_adj a short), so each export must hold one
// task_rename with oldcomm sh, newcomm true, oom_score_adj 0 and, as pid,
// the event's own pid. pcapng is left out: it holds packets only.
func TestExportKernelEventFields(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	tr := filepath.Join(dir, "tp.mgt")
	if r := magnet(t, "record", "-q", "-o", tr, "--events", "conn", "--tracepoint", "task:task_rename", "--", "sh", "-c", "exec true"); r.code != 0 {
		t.Fatalf("record: %s", r.stderr)
	}
	formats := []string{"tsv", "csv", "jsonl", "parquet", "ulm", "perfetto"}
	for _, f := range formats {
		if f == "parquet" {
			needPyarrow(t)
		}
	}
	// The fields as each format names them; values as text.
	type rename struct{ pid, tpPid, oldc, newc, adj string }
	str := func(v any) string {
		switch x := v.(type) {
		case nil:
			return ""
		case string:
			return x
		case json.Number:
			return x.String()
		}
		b, _ := json.Marshal(v)
		return string(b)
	}
	fromRow := func(m map[string]any) rename {
		return rename{str(m["pid"]), str(m["task_rename_pid"]), str(m["oldcomm"]), str(m["newcomm"]), str(m["oom_score_adj"])}
	}
	for _, f := range formats {
		t.Run(f, func(t *testing.T) {
			out := filepath.Join(dir, "tp."+f)
			if r := magnet(t, "export", tr, "-f", f, "-o", out, "--no-conns"); r.code != 0 {
				t.Fatalf("export: %s", r.stderr)
			}
			var got []rename
			switch f {
			case "tsv", "csv":
				comma := '\t'
				if f == "csv" {
					comma = ','
				}
				for _, m := range delimitedRows(t, out, comma) {
					if m["event"] == "task_rename" {
						got = append(got, fromRow(m))
					}
				}
			case "jsonl", "parquet":
				var rows []map[string]any
				if f == "parquet" {
					rows = parquetRows(t, out)
				} else {
					b, err := os.ReadFile(out)
					if err != nil {
						t.Fatal(err)
					}
					rows = jsonRows(t, string(b))
				}
				for _, m := range rows {
					if m["event"] == "task_rename" {
						got = append(got, fromRow(m))
					}
				}
			case "ulm":
				b, err := os.ReadFile(out)
				if err != nil {
					t.Fatal(err)
				}
				for _, line := range strings.Split(string(b), "\n") {
					kv := map[string]any{}
					for _, w := range strings.Fields(line) {
						k, v, _ := strings.Cut(w, "=")
						kv[k] = v
					}
					if kv["NL.EVNT"] == "task_rename" {
						got = append(got, rename{str(kv["MAGNET.PID"]), str(kv["MAGNET.TASK_RENAME_PID"]), str(kv["MAGNET.OLDCOMM"]), str(kv["MAGNET.NEWCOMM"]), str(kv["MAGNET.OOM_SCORE_ADJ"])})
					}
				}
			case "perfetto":
				b, err := os.ReadFile(out)
				if err != nil {
					t.Fatal(err)
				}
				dec := json.NewDecoder(strings.NewReader(string(b)))
				dec.UseNumber()
				var doc struct {
					TraceEvents []struct {
						Name string         `json:"name"`
						Args map[string]any `json:"args"`
					} `json:"traceEvents"`
				}
				if err := dec.Decode(&doc); err != nil {
					t.Fatal(err)
				}
				for _, e := range doc.TraceEvents {
					if e.Name == "task_rename" {
						// Perfetto's own pid is the trace's track: the
						// tracepoint's pid field keeps its own name.
						a := e.Args
						got = append(got, rename{str(a["pid"]), str(a["pid"]), str(a["oldcomm"]), str(a["newcomm"]), str(a["oom_score_adj"])})
					}
				}
			}
			found := false
			for _, g := range got {
				if g.oldc == "sh" && g.newc == "true" {
					found = true
					if g.adj != "0" || g.pid == "" || g.tpPid != g.pid {
						t.Errorf("task_rename sh -> true: %+v, want oom_score_adj 0 and the tracepoint's pid the event's", g)
					}
				}
			}
			if !found {
				t.Errorf("no task_rename sh -> true among %d task_rename rows: %+v", len(got), got)
			}
		})
	}
}
