// SPDX-License-Identifier: Apache-2.0

package export_test

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/tracegen"
)

// TestDatasetErrorApart: a call that failed has its error code in the
// error column and a null size, so that sum(size) is bytes; a call that
// moved bytes has no error.
func TestDatasetErrorApart(t *testing.T) {
	if err := exec.Command("python3", "-c", "import duckdb").Run(); err != nil {
		t.Skip("duckdb not installed for python3 (scripts/deps.sh installs it)")
	}
	start := time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC)
	h := tracegen.Header(t, "h", start)
	path, w := tracegen.Create(t, "h.mgt", h)
	// sock_send 1000 B, sock_send -ECONNRESET, sock_recv 10 B, sock_recv
	// -EAGAIN, ten times over.
	calls := []struct {
		event string
		size  int32
	}{{"sock_send", 1000}, {"sock_send", -104}, {"sock_recv", 10}, {"sock_recv", -11}}
	for i := 0; i < 40; i++ {
		c := calls[i%len(calls)]
		rec := tracegen.Record(h, c.event, start.Add(time.Duration(i)*1000))
		binary.NativeEndian.PutUint64(rec[8:], 7)
		binary.NativeEndian.PutUint32(rec[20:], uint32(c.size))
		if err := w.Write(rec); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(nil); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := export.WriteDataset(dir, []string{path}, export.DatasetOptions{Partition: []string{"host", "date"}}); err != nil {
		t.Fatal(err)
	}
	res := duckdb(t, dir, []string{
		`SELECT event, size, error, count(*) FROM read_parquet('events/*/*/*.parquet', hive_partitioning = true) GROUP BY ALL ORDER BY event, error NULLS FIRST`,
		`SELECT sum(size) FROM read_parquet('events/*/*/*.parquet', hive_partitioning = true) WHERE event = 'sock_send'`,
	})
	if got, want := fmt.Sprint(res[0]), "[[sock_recv 10 <nil> 10] [sock_recv <nil> 11 10] [sock_send 1000 <nil> 10] [sock_send <nil> 104 10]]"; got != want {
		t.Errorf("(event, size, error, rows): %s, want %s", got, want)
	}
	if got := fmt.Sprint(res[1]); got != "[[10000]]" {
		t.Errorf("bytes sent: %s, want 10 x 1000", got)
	}
}

// TestDatasetFileLayout: a trace of more events than a row group makes
// one file per table whose row groups hold DatasetRowGroup rows (the last
// the rest) and whose every column chunk is zstd-compressed, as read by
// DuckDB's own Parquet reader; no column carries an unsigned annotation
// and ts is a UTC timestamp in the file's own schema.
func TestDatasetFileLayout(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 1.2 M events")
	}
	if err := exec.Command("python3", "-c", "import duckdb").Run(); err != nil {
		t.Skip("duckdb not installed for python3 (scripts/deps.sh installs it)")
	}
	path := filepath.Join(t.TempDir(), "big.mgt")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := tracegen.Write(f, tracegen.Options{Events: export.DatasetRowGroup + 150_000, Conns: 2}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	st, err := export.WriteDataset(dir, []string{path}, export.DatasetOptions{Partition: []string{"host", "date"}})
	if err != nil {
		t.Fatal(err)
	}
	events, _ := filepath.Glob(filepath.Join(dir, "events", "*", "*", "*.parquet"))
	conns, _ := filepath.Glob(filepath.Join(dir, "conns", "*", "*", "*.parquet"))
	if len(events) != 1 || len(conns) != 1 {
		t.Fatalf("%d events files, %d conns files, want one each", len(events), len(conns))
	}
	res := duckdb(t, dir, []string{
		`SELECT row_group_id, any_value(row_group_num_rows) FROM parquet_metadata('events/*/*/*.parquet') GROUP BY ALL ORDER BY 1`,
		`SELECT DISTINCT compression FROM parquet_metadata('events/*/*/*.parquet')`,
		`SELECT DISTINCT compression FROM parquet_metadata('conns/*/*/*.parquet')`,
		`SELECT count(*) FROM read_parquet('events/*/*/*.parquet')`,
		// What Trino's and Spark's Parquet readers go by: an unsigned
		// annotation (UINT_64) is what makes them read decimal(20,0).
		`SELECT name, converted_type FROM parquet_schema(['events/*/*/*.parquet', 'conns/*/*/*.parquet']) WHERE converted_type LIKE 'UINT%' OR logical_type LIKE '%isSigned=0%'`,
		`SELECT count(*) FROM parquet_schema('events/*/*/*.parquet') WHERE name = 'ts' AND converted_type = 'TIMESTAMP_MICROS' AND logical_type LIKE '%isAdjustedToUTC=1%'`,
	})
	if len(res[4]) != 0 {
		t.Errorf("unsigned columns: %v", res[4])
	}
	if fmt.Sprint(res[5]) != "[[1]]" {
		t.Errorf("ts is not a UTC TIMESTAMP_MICROS column")
	}
	total := int(res[3][0][0].(float64))
	if uint64(total) != st.Events {
		t.Fatalf("%d rows, %d events exported", total, st.Events)
	}
	var groups []int
	for _, row := range res[0] {
		groups = append(groups, int(row[1].(float64)))
	}
	if want := []int{export.DatasetRowGroup, total - export.DatasetRowGroup}; !slices.Equal(groups, want) {
		t.Errorf("row groups of %v rows, want %v", groups, want)
	}
	for i, table := range []string{"events", "conns"} {
		if got := fmt.Sprint(res[1+i]); got != "[[ZSTD]]" {
			t.Errorf("%s compression: %s, want ZSTD only", table, got)
		}
	}
	t.Logf("%d events: row groups of %v rows, zstd", total, groups)
}
