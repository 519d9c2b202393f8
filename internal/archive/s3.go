// SPDX-License-Identifier: Apache-2.0

package archive

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3 is a bucket (and a prefix in it) of an S3-compatible object store.
type S3 struct {
	Client *minio.Client
	Bucket string
	Prefix string
}

// NewS3 connects to an object store. endpoint is a URL (http:// for a
// plain-text store, https:// otherwise) or a bare host:port (https).
func NewS3(endpoint, bucket, prefix, region, accessKey, secretKey string) (*S3, error) {
	host, secure := endpoint, true
	if u, err := url.Parse(endpoint); err == nil && u.Host != "" {
		host, secure = u.Host, u.Scheme != "http"
	}
	c, err := minio.New(host, &minio.Options{
		Creds:     credentials.NewStaticV4(accessKey, secretKey, ""),
		Secure:    secure,
		Region:    region,
		Transport: s3Transport,
	})
	if err != nil {
		return nil, fmt.Errorf("s3 %s: %w", endpoint, err)
	}
	return &S3{Client: c, Bucket: bucket, Prefix: strings.Trim(prefix, "/")}, nil
}

// Key returns the object name of an archive key.
func (s *S3) Key(key string) string {
	if s.Prefix == "" {
		return key
	}
	return s.Prefix + "/" + key
}

// S3FromURL opens s3://BUCKET/PREFIX with the endpoint and credentials of
// the usual environment variables: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY, AWS_REGION.
func S3FromURL(u string) (*S3, error) {
	rest := strings.TrimPrefix(u, "s3://")
	bucket, prefix, _ := strings.Cut(rest, "/")
	if bucket == "" {
		return nil, fmt.Errorf("%s: want s3://BUCKET[/PREFIX]", u)
	}
	endpoint := os.Getenv("AWS_ENDPOINT_URL")
	if endpoint == "" {
		endpoint = "https://s3.amazonaws.com"
	}
	return NewS3(endpoint, bucket, prefix, os.Getenv("AWS_REGION"), os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY"))
}

// s3Transport, when set (by tests, to count requests), carries every S3
// request.
var s3Transport http.RoundTripper

// listS3 reads the manifests of an S3 archive that the selection may want;
// Path is the object's s3:// URL.
func listS3(u string, sel Selection) ([]Entry, error) {
	s, err := S3FromURL(u)
	if err != nil {
		return nil, err
	}
	return s.ListSelected(context.Background(), sel)
}

// List reads every manifest under the prefix.
func (s *S3) List(ctx context.Context) ([]Entry, error) {
	return s.ListSelected(ctx, Selection{})
}

// ListSelected reads the manifests the selection may want, listing only
// the HOST/ and HOST/DATE/ prefixes it names: the hosts asked for (or every
// host, one listing with a delimiter), and of each the days of the window,
// with the last day before it that has files (pickDays). A query about one
// host and one hour of a bucket of 500 hosts and 30 days so costs three
// listings and the manifests of two days (48 GETs with hourly files), not
// 360,000 GETs.
func (s *S3) ListSelected(ctx context.Context, sel Selection) ([]Entry, error) {
	base := s.Prefix
	if base != "" {
		base += "/"
	}
	hosts := make([]string, 0, len(sel.Hosts))
	for _, h := range sel.Hosts {
		hosts = append(hosts, safe(h))
	}
	if len(hosts) == 0 {
		var err error
		if hosts, err = s.dirs(ctx, base); err != nil {
			return nil, err
		}
	}
	var out []Entry
	for _, h := range hosts {
		hostPrefix := base + h + "/"
		if sel.Since.IsZero() && sel.Until.IsZero() {
			es, err := s.manifests(ctx, hostPrefix)
			if err != nil {
				return nil, err
			}
			out = append(out, es...)
			continue
		}
		days, err := s.dirs(ctx, hostPrefix)
		if err != nil {
			return nil, err
		}
		for _, d := range pickDays(days, sel) {
			es, err := s.manifests(ctx, hostPrefix+d+"/")
			if err != nil {
				return nil, err
			}
			out = append(out, es...)
		}
	}
	return out, nil
}

// pickDays keeps of the days (YYYY-MM-DD, sorted) those that may hold a
// file with events in the selection's window: from the last day before the
// window's start (UTC) — a file started then may run into the window, and
// only the names, not the times, of the files are known before their
// manifests are read — to the day of its end.
func pickDays(days []string, sel Selection) []string {
	from, to := "", "9999-99-99"
	if !sel.Since.IsZero() {
		since := sel.Since.UTC().Format("2006-01-02")
		from = since
		for _, d := range days {
			if d < since {
				from = d
			}
		}
	}
	if !sel.Until.IsZero() {
		to = sel.Until.UTC().Format("2006-01-02")
	}
	var out []string
	for _, d := range days {
		if d >= from && d <= to {
			out = append(out, d)
		}
	}
	return out
}

// dirs lists the names of the "directories" right under prefix, sorted.
func (s *S3) dirs(ctx context.Context, prefix string) ([]string, error) {
	var out []string
	for obj := range s.Client.ListObjects(ctx, s.Bucket, minio.ListObjectsOptions{Prefix: prefix}) {
		if obj.Err != nil {
			return nil, fmt.Errorf("list s3://%s/%s: %w", s.Bucket, prefix, obj.Err)
		}
		if name, ok := strings.CutSuffix(strings.TrimPrefix(obj.Key, prefix), "/"); ok && name != "" && !strings.HasPrefix(name, ".") {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out, nil
}

// manifests reads every manifest under prefix: from the day indexes the
// listing finds (DayIndexName) where they hold a manifest at the size
// listed, else the manifest itself.
func (s *S3) manifests(ctx context.Context, prefix string) ([]Entry, error) {
	var objs []minio.ObjectInfo
	indexes := map[string]*DayIndex{} // by the day's "directory"
	for obj := range s.Client.ListObjects(ctx, s.Bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if obj.Err != nil {
			return nil, fmt.Errorf("list s3://%s/%s: %w", s.Bucket, prefix, obj.Err)
		}
		if path.Base(obj.Key) == DayIndexName {
			ix, err := s.readDayIndex(ctx, obj.Key)
			if err != nil {
				return nil, err
			}
			if ix != nil {
				indexes[path.Dir(obj.Key)] = ix
			}
			continue
		}
		if !strings.HasSuffix(obj.Key, ".mgt.zst"+ManifestSuffix) && !strings.HasSuffix(obj.Key, ".mgt"+ManifestSuffix) {
			continue
		}
		if strings.HasPrefix(path.Base(obj.Key), ".") {
			continue
		}
		objs = append(objs, obj)
	}
	var out []Entry
	for _, obj := range objs {
		if ix := indexes[path.Dir(obj.Key)]; ix != nil {
			if im, ok := ix.Manifests[path.Base(obj.Key)]; ok && im.Size == obj.Size {
				out = append(out, Entry{Manifest: im.Manifest, Path: "s3://" + s.Bucket + "/" + strings.TrimSuffix(obj.Key, ManifestSuffix)})
				continue
			}
		}
		o, err := s.Client.GetObject(ctx, s.Bucket, obj.Key, minio.GetObjectOptions{})
		if err != nil {
			return nil, fmt.Errorf("read s3://%s/%s: %w", s.Bucket, obj.Key, err)
		}
		data, err := io.ReadAll(io.LimitReader(o, 1<<20))
		o.Close()
		if err != nil {
			return nil, fmt.Errorf("read s3://%s/%s: %w", s.Bucket, obj.Key, err)
		}
		var m Manifest
		if err := json.Unmarshal(data, &m); err != nil {
			return nil, fmt.Errorf("manifest s3://%s/%s: %w", s.Bucket, obj.Key, err)
		}
		out = append(out, Entry{Manifest: m, Path: "s3://" + s.Bucket + "/" + strings.TrimSuffix(obj.Key, ManifestSuffix)})
	}
	return out, nil
}

// fetchS3 lists an S3 archive, keeps what the selection wants and downloads
// it into a new temporary directory; the entries then name local files.
func fetchS3(u string, sel Selection) ([]Entry, string, error) {
	s, err := S3FromURL(u)
	if err != nil {
		return nil, "", err
	}
	ctx := context.Background()
	all, err := s.ListSelected(ctx, sel)
	if err != nil {
		return nil, "", err
	}
	dir, err := os.MkdirTemp("", "magnet-s3-")
	if err != nil {
		return nil, "", err
	}
	var out []Entry
	chains := Select(all, sel)
	if sel.Skip != nil {
		chains = skipped(chains, sel.Skip)
	}
	for _, c := range chains {
		for _, e := range c.Entries {
			key := strings.TrimPrefix(e.Path, "s3://"+s.Bucket+"/")
			local := filepath.Join(dir, filepath.FromSlash(key))
			if err := os.MkdirAll(filepath.Dir(local), 0o755); err != nil {
				return nil, dir, err
			}
			if err := s.Client.FGetObject(ctx, s.Bucket, key, local, minio.GetObjectOptions{}); err != nil {
				return nil, dir, fmt.Errorf("download %s: %w", e.Path, err)
			}
			e.Path = local
			out = append(out, e)
		}
	}
	return out, dir, nil
}
