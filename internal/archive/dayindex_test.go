// SPDX-License-Identifier: Apache-2.0

package archive

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path"
	"reflect"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
)

// TestS3DayIndex: a listing reads one day index (HOST/DATE/.index.json)
// instead of each manifest of the day, and finds the manifests the store
// holds: one the index lacks (written after it) or holds at another size
// (rewritten since) is read itself, as is every manifest of a day whose
// index does not parse. Counted by the store's requests, through the
// client's transport.
func TestS3DayIndex(t *testing.T) {
	s, ct := countedS3(t, "s3://traces/site-a")
	ctx := context.Background()
	put := func(key string, data []byte) {
		t.Helper()
		if _, err := s.Client.PutObject(ctx, "traces", key, bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// 2 hosts x 3 days x 6 files of 4 hours, each manifest indexed as the
	// collect service does, but: node01's last file of day 1 is not in
	// the index (a run killed between the two writes), node01's first
	// manifest of day 0 was rewritten longer after it was indexed, and
	// node00's index of day 2 is garbage.
	const hosts, days, perDay = 2, 3, 6
	t0 := time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC)
	want := map[string]Manifest{}
	for h := 0; h < hosts; h++ {
		host := fmt.Sprintf("node%02d", h)
		for i := 0; i < days*perDay; i++ {
			start := t0.Add(time.Duration(i) * 4 * time.Hour)
			name := fmt.Sprintf("%s-%04d.mgt.zst", host, i)
			man := Manifest{Host: host, File: name, StartWallNs: start.UnixNano(), EndWallNs: start.Add(4 * time.Hour).UnixNano(),
				Recording: "rec-" + host, Seq: i, Compressed: true, Events: map[string]uint64{"sock_send": uint64(100 + i)}}
			data, _ := json.Marshal(man)
			key := s.Key(Key(host, start, name) + ManifestSuffix)
			put(key, data)
			if !(h == 1 && i == 2*perDay-1) {
				if err := s.AddToDayIndex(ctx, key, data); err != nil {
					t.Fatal(err)
				}
			}
			if h == 1 && i == 0 {
				man.Events["sock_recv"] = 7
				data, _ = json.Marshal(man)
				put(key, data)
			}
			want["s3://traces/"+key[:len(key)-len(ManifestSuffix)]] = man
		}
	}
	put(s.Key(path.Join("node00", t0.Add(2*24*time.Hour).Format("2006-01-02"), DayIndexName)), []byte("{not json"))

	ct.reset()
	all, err := Find("s3://traces/site-a", Selection{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Manifest{}
	for _, e := range all {
		got[e.Path] = e.Manifest
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("manifests through the indexes differ from the store's: %d found, %d there", len(got), len(want))
	}
	// 6 indexes + the unindexed one + the rewritten one + 6 of the day
	// whose index is garbage; 36 without indexes.
	if n := ct.gets.Load(); n != 6+1+1+perDay {
		t.Errorf("whole archive: %d GETs, want %d", n, 6+1+1+perDay)
	}
	t.Logf("whole archive: %d GETs for %d manifests", ct.gets.Load(), len(want))

	// One host, two hours of day 1: its index and the day before's.
	ct.reset()
	sel := Selection{Hosts: []string{"node00"}, Since: t0.Add(26 * time.Hour), Until: t0.Add(28 * time.Hour)}
	if _, err := Find("s3://traces/site-a", sel); err != nil {
		t.Fatal(err)
	}
	if n := ct.gets.Load(); n != 2 {
		t.Errorf("one host, two hours: %d GETs, want 2 (two days' indexes)", n)
	}
}
