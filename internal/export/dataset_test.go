// SPDX-License-Identifier: Apache-2.0

package export_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/trace"
	"github.com/magnet-tracer/magnet/internal/tracegen"
)

// BenchmarkDataset is `magnet export --dataset` of one trace file.
func BenchmarkDataset(b *testing.B) {
	tracegen.Bench(b, func(path string) error {
		_, err := export.WriteDataset(b.TempDir(), []string{path}, export.DatasetOptions{Partition: []string{"host", "date"}})
		return err
	})
}

// docQueries returns the SQL statements of the first ```sql block after
// marker in docs/DEPLOY.md.
func docQueries(t *testing.T, marker string) []string {
	t.Helper()
	data, err := os.ReadFile("../../docs/DEPLOY.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(data), marker)
	if !ok {
		t.Fatalf("docs/DEPLOY.md has no %q", marker)
	}
	_, block, ok := strings.Cut(after, "```sql\n")
	if !ok {
		t.Fatalf("no sql block after %q", marker)
	}
	block, _, _ = strings.Cut(block, "```")
	var out []string
	for _, st := range strings.Split(block, ";") {
		var lines []string
		for _, l := range strings.Split(st, "\n") {
			if !strings.HasPrefix(strings.TrimSpace(l), "--") {
				lines = append(lines, l)
			}
		}
		if q := strings.TrimSpace(strings.Join(lines, "\n")); q != "" {
			out = append(out, q)
		}
	}
	return out
}

// duckdb runs queries in dir and returns each one's rows as JSON values.
func duckdb(t *testing.T, dir string, queries []string) [][][]any {
	t.Helper()
	script := `
import duckdb, json, sys
qs = json.load(sys.stdin)
con = duckdb.connect()
# A slow query draws a progress bar on stdout, where the JSON goes.
con.execute("SET enable_progress_bar = false")
out = []
for q in qs:
    rows = con.execute(q).fetchall()
    out.append([[v if isinstance(v, (int, float, str, type(None))) else str(v) for v in r] for r in rows])
json.dump(out, sys.stdout)
`
	in, _ := json.Marshal(queries)
	cmd := exec.Command("python3", "-c", script)
	cmd.Dir = dir
	cmd.Stdin = strings.NewReader(string(in))
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("duckdb: %v\n%s", err, ee.Stderr)
		}
		t.Fatal(err)
	}
	var res [][][]any
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatal(err)
	}
	return res
}

// facts are what the traces hold, read with the trace reader.
type facts struct {
	sent      map[string]int64  // host -> sum of sock_send sizes >= 0
	retrans   int               // tcp_retrans records
	drops     int               // drop records
	maxCwnd   map[string]uint64 // host/trace/conn -> largest tcp_state cwnd
	events    map[string]int    // host -> rows the events table must have
	carriedCO int
}

func readFacts(t *testing.T, paths []string) facts {
	f := facts{sent: map[string]int64{}, maxCwnd: map[string]uint64{}, events: map[string]int{}}
	for _, p := range paths {
		r, err := trace.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		host := r.Header().Host
		name := filepath.Base(p)
		for {
			rec, err := r.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			switch rec.Type.Name {
			case "task", "iface":
				continue
			case "sock_send":
				if n := rec.Size(); n >= 0 {
					f.sent[host] += int64(n)
				}
			case "tcp_retrans":
				f.retrans++
			case "drop":
				f.drops++
			case "tcp_state":
				cw, _ := rec.Uint("cwnd")
				k := fmt.Sprintf("%s/%s/%d", host, name, rec.Conn())
				f.maxCwnd[k] = max(f.maxCwnd[k], cw)
			}
			if rec.Flags()&trace.FlagCarried != 0 {
				f.carriedCO++
				continue
			}
			f.events[host]++
		}
		r.Close()
	}
	return f
}

// TestDatasetDuckDB writes traces as a dataset, then again with one more
// trace (only that one is written), and runs docs/DEPLOY.md's DuckDB
// queries on it, as written: their figures are those of the traces read
// directly, and every column has a type Spark and Trino read as is.
func TestDatasetDuckDB(t *testing.T) {
	if err := exec.Command("python3", "-c", "import duckdb").Run(); err != nil {
		t.Skip("duckdb not installed for python3 (scripts/deps.sh installs it)")
	}
	in, dir := t.TempDir(), t.TempDir()
	// scripts/spark-dataset.sh keeps the dataset to run Spark on it.
	if keep := os.Getenv("MAGNET_DATASET_KEEP"); keep != "" {
		dir = keep
	}
	write := func(name string, fn func(w ...io.Writer) error) []string {
		var paths []string
		var ws []io.Writer
		for _, n := range strings.Split(name, ",") {
			p := filepath.Join(in, n+".mgt")
			f, err := os.Create(p)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			paths, ws = append(paths, p), append(ws, f)
		}
		if err := fn(ws...); err != nil {
			t.Fatal(err)
		}
		return paths
	}
	pair := write("s-0000,r-0000", func(w ...io.Writer) error {
		_, err := tracegen.WritePair(w[0], w[1], tracegen.Options{Events: 60000, Conns: 3})
		return err
	})
	st, err := export.WriteDataset(dir, pair, export.DatasetOptions{Partition: []string{"host", "date"}})
	if err != nil || st.Written != 2 || st.Skipped != 0 {
		t.Fatalf("first run: %+v %v", st, err)
	}
	one := write("s-0001", func(w ...io.Writer) error {
		_, err := tracegen.Write(w[0], tracegen.Options{Events: 20000, Conns: 2})
		return err
	})
	all := append(pair, one...)
	st, err = export.WriteDataset(dir, all, export.DatasetOptions{Partition: []string{"host", "date"}})
	if err != nil || st.Written != 1 || st.Skipped != 2 {
		t.Fatalf("second run: %+v %v (want only the new file written)", st, err)
	}
	f := readFacts(t, all)

	qs := docQueries(t, "**DuckDB, on a laptop.**")
	if len(qs) != 4 {
		t.Fatalf("%d DuckDB queries in docs/DEPLOY.md, want 4", len(qs))
	}
	// Besides the documented ones: the row count per host and the types.
	qs = append(qs,
		`SELECT host, count(*) FROM read_parquet('events/*/*/*.parquet', hive_partitioning = true) GROUP BY ALL`,
		`SELECT column_name, column_type FROM (DESCRIBE SELECT * FROM read_parquet('events/*/*/*.parquet', hive_partitioning = true))`,
		`SELECT column_name, column_type FROM (DESCRIBE SELECT * FROM read_parquet('conns/*/*/*.parquet', hive_partitioning = true))`,
		`SELECT count(*), count(*) FILTER (WHERE carried) FROM read_parquet('conns/*/*/*.parquet', hive_partitioning = true)`,
	)
	res := duckdb(t, dir, qs)

	sent := map[string]int64{}
	for _, row := range res[0] {
		sent[row[0].(string)] += int64(row[2].(float64))
	}
	for h, want := range f.sent {
		if sent[h] != want {
			t.Errorf("query 1: host %s sent %d bytes, the traces %d", h, sent[h], want)
		}
	}
	if len(res[1]) != min(f.retrans, 20) || len(res[2]) != 0 && f.drops == 0 {
		t.Errorf("queries 2, 3: %d and %d rows, the traces have %d retransmits and %d drops", len(res[1]), len(res[2]), f.retrans, f.drops)
	}
	if len(res[3]) != min(len(f.maxCwnd), 20) {
		t.Errorf("query 4: %d rows, %d connections with tcp_state", len(res[3]), len(f.maxCwnd))
	}
	for _, row := range res[3] {
		k := fmt.Sprintf("%v/%v/%d", row[0], row[1], int64(row[2].(float64)))
		if uint64(row[4].(float64)) != f.maxCwnd[k] {
			t.Errorf("query 4: %s max cwnd %v, the trace %d", k, row[4], f.maxCwnd[k])
		}
	}
	for _, row := range res[4] {
		if h := row[0].(string); int(row[1].(float64)) != f.events[h] {
			t.Errorf("host %s: %v events rows, the traces %d", h, row[1], f.events[h])
		}
	}
	types := map[string]string{}
	for _, q := range res[5:7] {
		for _, row := range q {
			col, typ := row[0].(string), row[1].(string)
			types[col] = typ
			if regexp.MustCompile(`^(UBIGINT|UINTEGER|HUGEINT|UHUGEINT|DECIMAL)`).MatchString(typ) {
				t.Errorf("column %s is %s: Spark and Trino read unsigned 64-bit as decimal(20,0)", col, typ)
			}
		}
	}
	for col, want := range map[string]string{"time_ns": "BIGINT", "ts": "TIMESTAMP WITH TIME ZONE", "host": "VARCHAR", "date": "DATE",
		"size": "BIGINT", "error": "INTEGER", "conn": "BIGINT", "cwnd": "BIGINT", "carried": "BOOLEAN"} {
		if types[col] != want {
			t.Errorf("column %s: %s, want %s", col, types[col], want)
		}
	}
	t.Logf("%d traces -> %v events rows; conns rows, carried: %v; go %s", len(all), res[4], res[7], runtime.Version())
}

// TestDatasetCarried: a connection opened in the first file of a rotated
// recording is repeated (carried) at the start of the second; the dataset
// has its conn_open once in the events and flags it carried in the second
// file's conns.
func TestDatasetCarried(t *testing.T) {
	if err := exec.Command("python3", "-c", "import duckdb").Run(); err != nil {
		t.Skip("duckdb not installed for python3 (scripts/deps.sh installs it)")
	}
	in, dir := t.TempDir(), t.TempDir()
	paths := rotatedWithConn(t, in)
	if len(paths) != 2 {
		t.Fatalf("%d files", len(paths))
	}
	if _, err := export.WriteDataset(dir, paths, export.DatasetOptions{Partition: []string{"date"}}); err != nil {
		t.Fatal(err)
	}
	res := duckdb(t, dir, []string{
		`SELECT trace, count(*) FILTER (WHERE event = 'conn_open'), count(*) FILTER (WHERE event = 'sock_send'), min(host) FROM read_parquet('events/*/*.parquet', hive_partitioning = true) GROUP BY ALL ORDER BY trace`,
		`SELECT trace, conn, carried, events, host FROM read_parquet('conns/*/*.parquet', hive_partitioning = true) ORDER BY trace`,
	})
	if got := fmt.Sprint(res[0]); got != "[[h-0000.mgt 1 60 h] [h-0001.mgt 0 60 h]]" {
		t.Errorf("events per file (trace, conn_open, sock_send, host): %s", got)
	}
	if got := fmt.Sprint(res[1]); got != "[[h-0000.mgt 7 false 60 h] [h-0001.mgt 7 true 60 h]]" {
		t.Errorf("conns per file (trace, conn, carried, events, host): %s", got)
	}
}
