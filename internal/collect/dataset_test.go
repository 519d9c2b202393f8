// SPDX-License-Identifier: Apache-2.0

package collect

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/parquet-go/parquet-go"
)

// datasetRows counts the files and rows of the dataset's events tree.
func datasetRows(t *testing.T, dir string) (files int, rows int64) {
	t.Helper()
	filepath.WalkDir(filepath.Join(dir, "events"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".parquet") || strings.HasPrefix(d.Name(), ".") {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		fi, _ := f.Stat()
		pf, err := parquet.OpenFile(f, fi.Size())
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		files++
		rows += pf.NumRows()
		return nil
	})
	return files, rows
}

// TestShipDataset: with dataset.dir set, each finished spool file is added
// to the Hive dataset (host and date partitions) as it is shipped, the file
// being written is not, a later pass adds only the new file, and in the end
// the dataset holds every record written, once.
func TestShipDataset(t *testing.T) {
	root, ds := t.TempDir(), t.TempDir()
	cfg := testConfig(t, Target{Type: "dir", Path: root})
	cfg.Dataset = DatasetConfig{Dir: ds, Partition: []string{"host", "date"}}
	sink, written := spool(t, cfg, 3, true)
	s, logs := newShipper(t, cfg)
	s.Pass(context.Background())
	part := filepath.Join(ds, "events", "host=web1", "date="+time.Now().UTC().Format("2006-01-02"))
	if ents, err := os.ReadDir(part); err != nil || len(ents) != 3 {
		t.Fatalf("%s: %d entries, %v; want the 3 finished files", part, len(ents), err)
	}
	if n, _ := datasetRows(t, ds); n != 3 {
		t.Fatalf("%d events files, want 3 (the open one waits)", n)
	}
	if err := sink.Close(nil); err != nil {
		t.Fatal(err)
	}
	s.Pass(context.Background())
	s.Pass(context.Background())
	files, rows := datasetRows(t, ds)
	if files != 4 || rows != int64(written) {
		t.Fatalf("dataset: %d files, %d rows; want 4 files, %d rows", files, rows, written)
	}
	added := 0
	for _, l := range *logs {
		if strings.HasPrefix(l, "added ") {
			added++
		}
	}
	if added != 4 {
		t.Fatalf("%d files added to the dataset, want 4 (each once):\n%s", added, strings.Join(*logs, "\n"))
	}
	if es := archived(t, root); len(es) != 4 {
		t.Fatalf("%d files archived, want 4", len(es))
	}
}

// A dataset with an unknown partition level is refused when the
// configuration is loaded.
func TestConfigDatasetPartition(t *testing.T) {
	c, err := Parse([]byte("host: h\nspool: /tmp/x\ndataset: {dir: /tmp/ds, partition: [host, week]}\ntargets:\n  - {type: dir, path: /tmp/a}\n"))
	if err == nil || !strings.Contains(err.Error(), "dataset: --partition \"week\"") {
		t.Fatalf("config %+v, err %v: want the partition refused", c, err)
	}
	c, err = Parse([]byte("host: h\nspool: /tmp/x\ndataset: {dir: /tmp/ds}\ntargets:\n  - {type: dir, path: /tmp/a}\n"))
	if err != nil || strings.Join(c.Dataset.Partition, ",") != "host,date" {
		t.Fatalf("config %+v, err %v: want partition host,date by default", c, err)
	}
	// The shipper writes the dataset, and only runs with targets: a
	// dataset without one would stay empty without a word.
	c, err = Parse([]byte("host: h\nspool: /tmp/x\ndataset: {dir: /tmp/ds}\n"))
	if err == nil || !strings.Contains(err.Error(), "dataset: needs a target") {
		t.Fatalf("config %+v, err %v: want a dataset without targets refused", c, err)
	}
}
