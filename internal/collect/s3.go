// SPDX-License-Identifier: Apache-2.0

package collect

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/minio/minio-go/v7"

	"github.com/magnet-tracer/magnet/internal/archive"
)

// s3Archive ships to an S3-compatible object store in one PUT per file: a
// single PUT is atomic (the object appears whole or not at all), the store
// checks the body against Content-MD5, and the object's ETag (the MD5 of a
// single-part object), size and sha256 metadata are checked after.
type s3Archive struct {
	name string
	s3   *archive.S3
}

func newS3Archive(t Target) (*s3Archive, error) {
	ak, sk := t.AccessKey, t.SecretKey
	if ak == "" {
		ak = os.Getenv(orDefault(t.AccessKeyEnv, "AWS_ACCESS_KEY_ID"))
	}
	if sk == "" {
		sk = os.Getenv(orDefault(t.SecretKeyEnv, "AWS_SECRET_ACCESS_KEY"))
	}
	s, err := archive.NewS3(t.Endpoint, t.Bucket, t.Prefix, t.Region, ak, sk)
	if err != nil {
		return nil, err
	}
	return &s3Archive{name: t.Name, s3: s}, nil
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

func (s *s3Archive) Name() string { return s.name }

const shaMeta = "Magnet-Sha256"

func (s *s3Archive) Has(ctx context.Context, key string, b Blob) (bool, error) {
	info, err := s.s3.Client.StatObject(ctx, s.s3.Bucket, s.s3.Key(key), minio.StatObjectOptions{})
	if err != nil {
		if minio.ToErrorResponse(err).Code == "NoSuchKey" || minio.ToErrorResponse(err).StatusCode == 404 {
			return false, nil
		}
		return false, fmt.Errorf("s3 stat %s: %w", key, err)
	}
	return info.Size == b.Size && metaSHA(info.UserMetadata) == b.SHA256, nil
}

func metaSHA(m map[string]string) string {
	for k, v := range m {
		if strings.EqualFold(k, shaMeta) || strings.EqualFold(k, "X-Amz-Meta-"+shaMeta) {
			return v
		}
	}
	return ""
}

func (s *s3Archive) Put(ctx context.Context, key string, b Blob) error {
	if err := s.ensureBucket(ctx); err != nil {
		return err
	}
	f, err := os.Open(b.Path)
	if err != nil {
		return err
	}
	defer f.Close()
	obj := s.s3.Key(key)
	_, err = s.s3.Client.PutObject(ctx, s.s3.Bucket, obj, f, b.Size, minio.PutObjectOptions{
		UserMetadata:     map[string]string{shaMeta: b.SHA256},
		ContentType:      "application/octet-stream",
		DisableMultipart: true,
		SendContentMd5:   true,
	})
	if err != nil {
		return fmt.Errorf("s3 put %s: %w", obj, err)
	}
	info, err := s.s3.Client.StatObject(ctx, s.s3.Bucket, obj, minio.StatObjectOptions{})
	if err != nil {
		return fmt.Errorf("s3 verify %s: %w", obj, err)
	}
	if etag := strings.Trim(info.ETag, `"`); info.Size != b.Size || !strings.EqualFold(etag, b.MD5) || metaSHA(info.UserMetadata) != b.SHA256 {
		return fmt.Errorf("s3 verify %s: %d bytes, etag %s, sha256 %q; want %d bytes, md5 %s, sha256 %s",
			obj, info.Size, etag, metaSHA(info.UserMetadata), b.Size, b.MD5, b.SHA256)
	}
	// A manifest goes into its day's index too, which listings read
	// instead of each manifest. A failure fails the shipment, retried
	// like any other (the trace is then found there, not sent again).
	if strings.HasSuffix(key, archive.ManifestSuffix) {
		data, err := os.ReadFile(b.Path)
		if err != nil {
			return err
		}
		if err := s.s3.AddToDayIndex(ctx, obj, data); err != nil {
			return err
		}
	}
	return nil
}

func (s *s3Archive) ensureBucket(ctx context.Context) error {
	ok, err := s.s3.Client.BucketExists(ctx, s.s3.Bucket)
	if err != nil {
		return fmt.Errorf("s3 bucket %s: %w", s.s3.Bucket, err)
	}
	if !ok {
		if err := s.s3.Client.MakeBucket(ctx, s.s3.Bucket, minio.MakeBucketOptions{}); err != nil {
			return fmt.Errorf("s3 create bucket %s: %w", s.s3.Bucket, err)
		}
	}
	return nil
}
