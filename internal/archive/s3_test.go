// SPDX-License-Identifier: Apache-2.0

package archive

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/magnet-tracer/magnet/internal/archivetest"
)

// countingTransport counts the S3 requests: manifest GETs and listings.
type countingTransport struct {
	gets, lists, traces atomic.Int64
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodGet {
		if strings.HasSuffix(r.URL.Path, ManifestSuffix) {
			c.gets.Add(1)
		} else if IsTrace(path.Base(r.URL.Path)) {
			c.traces.Add(1)
		} else if r.URL.Query().Has("list-type") || r.URL.Query().Has("prefix") {
			c.lists.Add(1)
		}
	}
	return http.DefaultTransport.RoundTrip(r)
}

func (c *countingTransport) reset() { c.gets.Store(0); c.lists.Store(0); c.traces.Store(0) }

// countedS3 starts a moto S3 server with an empty bucket "traces" and
// returns the store at url on it, its requests counted through ct.
func countedS3(t *testing.T, url string) (s *S3, ct *countingTransport) {
	t.Helper()
	m := archivetest.StartMoto(t)
	ct = &countingTransport{}
	s3Transport = ct
	t.Cleanup(func() { s3Transport = nil })
	t.Setenv("AWS_ENDPOINT_URL", m.Endpoint)
	t.Setenv("AWS_ACCESS_KEY_ID", archivetest.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", archivetest.SecretKey)
	t.Setenv("AWS_REGION", "us-east-1")
	s, err := S3FromURL(url)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Client.MakeBucket(context.Background(), "traces", minio.MakeBucketOptions{}); err != nil {
		t.Fatal(err)
	}
	return s, ct
}

// TestS3ListsWhatIsAsked: archive queries on s3:// list the HOST/ and
// HOST/DATE/ prefixes of the selection and read only those manifests (the
// store's own request count, through the client's transport), and find the
// same files as a read of the whole bucket.
func TestS3ListsWhatIsAsked(t *testing.T) {
	s, ct := countedS3(t, "s3://traces/site-a")
	ctx := context.Background()
	// 6 hosts x 5 days x 6 files of 4 hours (manifests only: listing
	// reads nothing else).
	const hosts, days, perDay = 6, 5, 6
	t0 := time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC)
	for h := 0; h < hosts; h++ {
		host := fmt.Sprintf("node%02d", h)
		for i := 0; i < days*perDay; i++ {
			start := t0.Add(time.Duration(i) * 4 * time.Hour)
			name := fmt.Sprintf("%s-%04d.mgt.zst", host, i)
			man := Manifest{Host: host, File: name, StartWallNs: start.UnixNano(), EndWallNs: start.Add(4 * time.Hour).UnixNano(),
				Recording: "rec-" + host, Seq: i, Compressed: true}
			data, _ := json.Marshal(man)
			key := s.Key(Key(host, start, name) + ManifestSuffix)
			if _, err := s.Client.PutObject(ctx, "traces", key, bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	total := hosts * days * perDay

	ct.reset()
	all, err := Find("s3://traces/site-a", Selection{})
	if err != nil || len(all) != total {
		t.Fatalf("whole bucket: %d entries, %v", len(all), err)
	}
	t.Logf("whole bucket: %d manifest GETs, %d listings", ct.gets.Load(), ct.lists.Load())
	if ct.gets.Load() != int64(total) {
		t.Fatalf("whole bucket: %d GETs, want %d", ct.gets.Load(), total)
	}

	for _, tc := range []struct {
		name string
		sel  Selection
		gets int64 // manifests read
	}{
		// One host, two hours of the third day: the manifests of that day
		// and the day before (whose last file may run into the window).
		{"host+hours", Selection{Hosts: []string{"node03"}, Since: t0.Add(50 * time.Hour), Until: t0.Add(52 * time.Hour)}, 2 * perDay},
		// Two hosts, every day.
		{"hosts", Selection{Hosts: []string{"node01", "node04"}}, 2 * days * perDay},
		// Every host, two hours.
		{"hours", Selection{Since: t0.Add(74 * time.Hour), Until: t0.Add(76 * time.Hour)}, hosts * 2 * perDay},
		// A window before everything: nothing read but the listings.
		{"before", Selection{Until: t0.Add(-time.Hour)}, 0},
	} {
		ct.reset()
		got, err := Find("s3://traces/site-a", tc.sel)
		if err != nil {
			t.Fatal(err)
		}
		if ct.gets.Load() != tc.gets {
			t.Errorf("%s: %d manifest GETs, want %d", tc.name, ct.gets.Load(), tc.gets)
		}
		want := paths(Select(all, tc.sel))
		if have := paths(Select(got, tc.sel)); !slices.Equal(have, want) {
			t.Errorf("%s: selected %v, the whole bucket's selection %v", tc.name, have, want)
		}
		t.Logf("%s: %d manifest GETs (of %d), %d listings, %d files selected", tc.name, ct.gets.Load(), total, ct.lists.Load(), len(want))
	}
}

func paths(cs []*Chain) []string {
	var out []string
	for _, c := range cs {
		for _, e := range c.Entries {
			out = append(out, e.Path)
		}
	}
	return out
}

// TestS3SkipBeforeDownload: a file the caller says it has no use for
// (Selection.Skip: already in a dataset) is never downloaded.
func TestS3SkipBeforeDownload(t *testing.T) {
	s, ct := countedS3(t, "s3://traces")
	ctx := context.Background()
	local := t.TempDir()
	recording(t, local, "a", time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC), 4)
	es, err := Scan(local)
	if err != nil || len(es) != 4 {
		t.Fatalf("%d local traces, %v", len(es), err)
	}
	for _, e := range es {
		m, err := Describe(e.Path)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := json.Marshal(m)
		key := Key(m.Host, m.Start(), filepath.Base(e.Path))
		if _, err := s.Client.FPutObject(ctx, "traces", key, e.Path, minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Client.PutObject(ctx, "traces", key+ManifestSuffix, bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ct.reset()
	skip := func(e *Entry) bool { return e.Seq < 2 } // files 0 and 1 converted already
	srcs, cleanup, err := Resolve([]string{"s3://traces"}, Selection{Skip: skip})
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	if len(srcs) != 1 || len(srcs[0].Paths) != 2 || ct.traces.Load() != 2 {
		t.Fatalf("sources %+v; %d traces downloaded, want 2", srcs, ct.traces.Load())
	}
	for _, p := range srcs[0].Paths {
		if _, err := os.Stat(p); err != nil {
			t.Fatal(err)
		}
	}
	_, _, err = Resolve([]string{"s3://traces"}, Selection{Skip: func(*Entry) bool { return true }})
	if !errors.Is(err, ErrNoMatch) {
		t.Fatalf("everything skipped: %v, want ErrNoMatch", err)
	}
}
