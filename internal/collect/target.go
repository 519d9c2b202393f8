// SPDX-License-Identifier: Apache-2.0

package collect

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/magnet-tracer/magnet/internal/archive"
	"github.com/magnet-tracer/magnet/internal/fault"
)

// Blob is a local file to put into an archive, with what verifies it.
type Blob struct {
	Path   string // local file
	Size   int64
	SHA256 string // hex
	MD5    string // hex: what an S3 single PUT's ETag is
}

// Archive is one place traces are shipped to. Put must be atomic (the key
// holds either nothing or the whole, verified file) and Has must tell a
// complete copy from anything else, so that a shipment cut off by a crash is
// redone and one that completed is never redone.
type Archive interface {
	Name() string
	// Has reports whether key holds exactly b (size and SHA-256).
	Has(ctx context.Context, key string, b Blob) (bool, error)
	// Put stores b as key, verified.
	Put(ctx context.Context, key string, b Blob) error
}

// NewArchive makes the archive a target describes.
func NewArchive(t Target) (Archive, error) {
	switch t.Type {
	case "dir":
		return &dirArchive{name: t.Name, root: t.Path}, nil
	case "ssh":
		return newSSHArchive(t), nil
	case "s3":
		return newS3Archive(t)
	}
	return nil, fmt.Errorf("unknown target type %q", t.Type)
}

// dirArchive is a local (or mounted) directory.
type dirArchive struct {
	name, root string
}

func (d *dirArchive) Name() string { return d.name }

func (d *dirArchive) Has(_ context.Context, key string, b Blob) (bool, error) {
	p := filepath.Join(d.root, filepath.FromSlash(key))
	sum, n, err := fileSHA256(p)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return n == b.Size && sum == b.SHA256, nil
}

// Put copies to a dot-name in the final directory, syncs, reads the copy
// back to verify it, and renames it into place.
func (d *dirArchive) Put(_ context.Context, key string, b Blob) error {
	final := filepath.Join(d.root, filepath.FromSlash(key))
	dir := filepath.Dir(final)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+filepath.Base(final)+".part")
	if err := copyFile(tmp, b.Path); err != nil {
		os.Remove(tmp)
		return err
	}
	sum, n, err := fileSHA256(tmp)
	if err != nil {
		os.Remove(tmp)
		return err
	}
	if n != b.Size || sum != b.SHA256 {
		os.Remove(tmp)
		return fmt.Errorf("verify %s: %d bytes sha256 %s, want %d bytes %s", tmp, n, sum, b.Size, b.SHA256)
	}
	fault.At("ship:before-rename")
	if err := os.Rename(tmp, final); err != nil {
		return err
	}
	return syncDir(dir)
}

func copyFile(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

func fileSHA256(p string) (string, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// sshArchive ships with the system's ssh client (archive.SSH): the site's
// own ssh configuration, keys, agent, known hosts and jump hosts; only a
// POSIX shell with sha256sum is needed on the archive host (no scp, rsync
// or sftp server). One connection carries every session while the shipper
// runs (ControlMaster): a file costs three sessions, and a handshake each
// would be most of the time.
type sshArchive struct {
	name string
	ssh  *archive.SSH
}

func newSSHArchive(t Target) *sshArchive {
	opts := []string{}
	if t.IdentityFile != "" {
		opts = append(opts, "IdentityFile="+t.IdentityFile, "IdentitiesOnly=yes")
	}
	if t.KnownHosts != "" {
		opts = append(opts, "UserKnownHostsFile="+t.KnownHosts, "StrictHostKeyChecking=yes")
	}
	opts = append(opts, t.SSHOptions...)
	return &sshArchive{name: t.Name, ssh: &archive.SSH{User: t.User, Host: t.SSHHost, Port: t.Port, Path: t.Path, Options: opts}}
}

func (s *sshArchive) Name() string { return s.name }

// Close ends the shared connection.
func (s *sshArchive) Close() error { return s.ssh.Close() }

// Has runs sha256sum on the archive host.
func (s *sshArchive) Has(ctx context.Context, key string, b Blob) (bool, error) {
	f := shellQuote(s.ssh.Remote(key))
	out, err := s.ssh.Run(ctx, fmt.Sprintf("if [ -f %s ]; then sha256sum < %s | cut -d' ' -f1; wc -c < %s; fi", f, f, f), nil)
	if err != nil {
		return false, err
	}
	fields := strings.Fields(out)
	if len(fields) != 2 {
		return false, nil
	}
	n, _ := strconv.ParseInt(fields[1], 10, 64)
	return fields[0] == b.SHA256 && n == b.Size, nil
}

// Put streams the file to a dot-name beside its final place, has the
// archive host check its size and sha256sum, and renames it into place
// there only if both match: one ssh session per file.
func (s *sshArchive) Put(ctx context.Context, key string, b Blob) error {
	final := s.ssh.Remote(key)
	dir := path.Dir(final)
	tmp := path.Join(dir, "."+path.Base(final)+".part")
	script := fmt.Sprintf(`set -e; mkdir -p %[1]s; cat > %[2]s; s=$(sha256sum < %[2]s | cut -d' ' -f1); n=$(wc -c < %[2]s); `+
		`if [ "$s" = %[3]s ] && [ "$n" -eq %[4]d ]; then sync %[2]s 2>/dev/null || true; mv -f %[2]s %[5]s; sync %[1]s 2>/dev/null || true; echo "verified $s $n"; `+
		`else rm -f %[2]s; echo "mismatch $s $n"; exit 3; fi`,
		shellQuote(dir), shellQuote(tmp), b.SHA256, b.Size, shellQuote(final))
	f, err := os.Open(b.Path)
	if err != nil {
		return err
	}
	defer f.Close()
	out, err := s.ssh.Run(ctx, script, f)
	if err != nil {
		return fmt.Errorf("%w %s", err, strings.TrimSpace(out))
	}
	if !strings.HasPrefix(out, "verified "+b.SHA256) {
		return fmt.Errorf("ssh %s: no verification from the archive host: %q", s.ssh.Host, out)
	}
	return nil
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string { return archive.ShellQuote(s) }

// archiveKey is where a file goes under a target's root or prefix.
func archiveKey(m *archive.Manifest) string {
	return archive.Key(m.Host, m.Start(), m.File)
}
