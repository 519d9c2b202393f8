// SPDX-License-Identifier: Apache-2.0

package archive

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path"

	"github.com/minio/minio-go/v7"
)

// DayIndexName is the object beside the traces of one host and day in an
// S3 archive (HOST/DATE/.index.json) that holds a copy of each of their
// manifests, so that a listing reads one object per day instead of one
// per file. It is a cache: the listing of the day stays the truth (a
// manifest the index lacks, or holds at another size, is read itself),
// and its dot-name keeps it out of what older readers take for manifests.
const DayIndexName = ".index.json"

// DayIndex is the content of a DayIndexName object: manifests by the base
// name of their object.
type DayIndex struct {
	Manifests map[string]IndexedManifest `json:"manifests"`
}

// IndexedManifest is one manifest and the size of its object (what the
// listing says of it, to tell a copy from a manifest written since).
type IndexedManifest struct {
	Size     int64    `json:"size"`
	Manifest Manifest `json:"manifest"`
}

// AddToDayIndex records the manifest just written as object manifestKey
// (data: its bytes) in the index of its day. The collect service calls it
// after each manifest, one shipment at a time per archive: read, add,
// write. An index that cannot be read as one is started anew.
func (s *S3) AddToDayIndex(ctx context.Context, manifestKey string, data []byte) error {
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return fmt.Errorf("day index: manifest %s: %w", manifestKey, err)
	}
	key := path.Join(path.Dir(manifestKey), DayIndexName)
	ix, err := s.readDayIndex(ctx, key)
	if err != nil {
		return err
	}
	if ix == nil || ix.Manifests == nil {
		ix = &DayIndex{Manifests: map[string]IndexedManifest{}}
	}
	ix.Manifests[path.Base(manifestKey)] = IndexedManifest{Size: int64(len(data)), Manifest: m}
	out, err := json.Marshal(ix)
	if err != nil {
		return err
	}
	if _, err := s.Client.PutObject(ctx, s.Bucket, key, bytes.NewReader(out), int64(len(out)), minio.PutObjectOptions{
		ContentType: "application/json", DisableMultipart: true, SendContentMd5: true,
	}); err != nil {
		return fmt.Errorf("day index: put %s: %w", key, err)
	}
	return nil
}

// readDayIndex reads an index object: nil when there is none or it does
// not parse (then it is rewritten, or not used); an error only when the
// store could not be asked.
func (s *S3) readDayIndex(ctx context.Context, key string) (*DayIndex, error) {
	o, err := s.Client.GetObject(ctx, s.Bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return nil, fmt.Errorf("day index: get %s: %w", key, err)
	}
	data, err := io.ReadAll(io.LimitReader(o, 64<<20))
	o.Close()
	if err != nil {
		if r := minio.ToErrorResponse(err); r.Code == "NoSuchKey" || r.StatusCode == 404 {
			return nil, nil
		}
		return nil, fmt.Errorf("day index: get %s: %w", key, err)
	}
	var ix DayIndex
	if json.Unmarshal(data, &ix) != nil {
		return nil, nil
	}
	return &ix, nil
}
