// SPDX-License-Identifier: Apache-2.0

package archive

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// SSH is an archive on another host, reached with the system's ssh client:
// it uses the site's own ssh configuration, keys, agent, known hosts and
// jump hosts, and keeps any SSH implementation out of magnet. The archive
// host needs a POSIX shell, find, cat and sha256sum; no scp, rsync or SFTP
// server.
//
// The sessions of one SSH share one connection (ControlMaster, its socket
// in a private directory) until Close.
type SSH struct {
	User string // "" = ssh's default
	Host string // host name, address or ~/.ssh/config alias
	Port int    // 0 = ssh's default
	Path string // the archive's root directory on Host
	// Options are more ssh -o options (IdentityFile=…, ProxyJump=…).
	Options []string

	ctlDir, ctlPath string
}

// SSHScheme starts an SSH archive's address: ssh://[USER@]HOST[:PORT]/PATH.
const SSHScheme = "ssh://"

// ParseSSH reads ssh://[USER@]HOST[:PORT]/PATH, PATH being absolute on the
// archive host (ssh://web@arch:2222/srv/magnet is /srv/magnet there).
func ParseSSH(u string, options []string) (*SSH, error) {
	bad := func(why string) error {
		return fmt.Errorf("%s: %s (want ssh://[USER@]HOST[:PORT]/PATH)", u, why)
	}
	pu, err := url.Parse(u)
	if err != nil || pu.Scheme != "ssh" {
		return nil, bad("not an ssh:// address")
	}
	s := &SSH{Host: pu.Hostname(), Path: pu.Path, Options: options}
	if pu.User != nil {
		if _, has := pu.User.Password(); has {
			return nil, bad("no password in the address: ssh uses keys or an agent")
		}
		s.User = pu.User.Username()
	}
	if p := pu.Port(); p != "" {
		if s.Port, err = strconv.Atoi(p); err != nil || s.Port <= 0 || s.Port > 65535 {
			return nil, bad("bad port " + p)
		}
	}
	switch {
	case s.Host == "":
		return nil, bad("no host")
	case strings.HasPrefix(s.Host, "-") || strings.HasPrefix(s.User, "-"):
		return nil, bad("host and user may not start with -")
	case s.Path == "":
		return nil, bad("no path")
	case pu.RawQuery != "" || pu.Fragment != "":
		return nil, bad("no ?query or #fragment")
	}
	s.Path = path.Clean(s.Path)
	return s, nil
}

// String is the archive's address.
func (s *SSH) String() string {
	return s.URL("")
}

// URL is the ssh:// address of key under the archive's root.
func (s *SSH) URL(key string) string {
	u := url.URL{Scheme: "ssh", Host: s.Host, Path: path.Join(s.Path, key)}
	if s.Port != 0 {
		u.Host += ":" + strconv.Itoa(s.Port)
	}
	if s.User != "" {
		u.User = url.User(s.User)
	}
	return u.String()
}

// key is the archive key of an entry's ssh:// Path.
func (s *SSH) key(u string) (string, error) {
	pu, err := url.Parse(u)
	if err != nil || !strings.HasPrefix(pu.Path, s.Path) {
		return "", fmt.Errorf("%s is not in %s", u, s)
	}
	return strings.TrimPrefix(strings.TrimPrefix(pu.Path, s.Path), "/"), nil
}

// Remote is where key is on the archive host.
func (s *SSH) Remote(key string) string { return path.Join(s.Path, key) }

// Command is ssh running the shell script on the archive host.
func (s *SSH) Command(ctx context.Context, script string) *exec.Cmd {
	if s.ctlDir == "" {
		if dir, err := os.MkdirTemp("", "magnet-ssh-"); err == nil {
			s.ctlDir, s.ctlPath = dir, filepath.Join(dir, "%C")
		}
	}
	args := []string{"-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=15"}
	if s.ctlPath != "" {
		args = append(args, "-o", "ControlMaster=auto", "-o", "ControlPath="+s.ctlPath, "-o", "ControlPersist=60")
	}
	if s.Port != 0 {
		args = append(args, "-p", strconv.Itoa(s.Port))
	}
	for _, o := range s.Options {
		args = append(args, "-o", o)
	}
	args = append(args, "--", s.dest(), script)
	cmd := exec.CommandContext(ctx, "ssh", args...)
	// The first session forks the shared connection's master, which keeps
	// the pipes open for ControlPersist: do not wait for it.
	cmd.WaitDelay = 500 * time.Millisecond
	return cmd
}

func (s *SSH) dest() string {
	if s.User != "" {
		return s.User + "@" + s.Host
	}
	return s.Host
}

// Run runs script on the archive host with stdin and returns its output.
func (s *SSH) Run(ctx context.Context, script string, stdin io.Reader) (string, error) {
	var out bytes.Buffer
	err := s.stream(ctx, script, stdin, &out)
	return out.String(), err
}

// stream runs script with its output to w; the error carries ssh's last
// line of complaint.
func (s *SSH) stream(ctx context.Context, script string, stdin io.Reader, w io.Writer) error {
	cmd := s.Command(ctx, script)
	cmd.Stdin = stdin
	var errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = w, &errb
	if err := cmd.Run(); err != nil && !errors.Is(err, exec.ErrWaitDelay) {
		msg := strings.TrimSpace(errb.String())
		if i := strings.LastIndexByte(msg, '\n'); i >= 0 {
			msg = msg[i+1:]
		}
		if msg == "" {
			return fmt.Errorf("ssh %s: %w", s.Host, err)
		}
		return fmt.Errorf("ssh %s: %w: %s", s.Host, err, msg)
	}
	return nil
}

// Close ends the shared connection.
func (s *SSH) Close() error {
	if s.ctlDir == "" {
		return nil
	}
	cmd := s.Command(context.Background(), "")
	// ssh -O exit DEST: the control command instead of a session.
	args := append([]string{cmd.Args[0], "-O", "exit"}, cmd.Args[1:len(cmd.Args)-1]...)
	cmd.Args = args
	_ = cmd.Run()
	err := os.RemoveAll(s.ctlDir)
	s.ctlDir, s.ctlPath = "", ""
	return err
}

// List reads every manifest of the archive in one session; Path is each
// trace's ssh:// address. Traces without a manifest (not yet committed by
// the shipper) are left out, and so are dot-names (uploads under way).
func (s *SSH) List(ctx context.Context) ([]Entry, error) {
	// Each manifest as: its path, NUL, its bytes, NUL (JSON holds no NUL).
	script := fmt.Sprintf(`cd -- %s || exit 3; find . -type f \( -name '*.mgt.zst%[2]s' -o -name '*.mgt%[2]s' \) ! -path '*/.*' `+
		`-exec sh -c 'for f; do printf "%%s\0" "$f"; cat -- "$f"; printf "\0"; done' sh {} +`,
		ShellQuote(s.Path), ManifestSuffix)
	out, err := s.Run(ctx, script, nil)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", s, err)
	}
	parts := strings.Split(out, "\x00")
	type found struct {
		rel string
		m   Manifest
	}
	var fs []found
	for i := 0; i+1 < len(parts); i += 2 {
		rel := strings.TrimPrefix(parts[i], "./")
		var m Manifest
		if err := json.Unmarshal([]byte(parts[i+1]), &m); err != nil {
			return nil, fmt.Errorf("manifest %s: %w", s.URL(rel), err)
		}
		fs = append(fs, found{rel, m})
	}
	// In the order of a local directory's Scan (names compared directory
	// by directory, as filepath.WalkDir walks), whatever order
	// find walked the archive host's directories in.
	sort.Slice(fs, func(i, j int) bool {
		return slices.Compare(strings.Split(fs[i].rel, "/"), strings.Split(fs[j].rel, "/")) < 0
	})
	entries := make([]Entry, 0, len(fs))
	for _, f := range fs {
		entries = append(entries, Entry{Manifest: f.m, Path: s.URL(strings.TrimSuffix(f.rel, ManifestSuffix))})
	}
	return entries, nil
}

// Fetch copies the trace at key (relative to the archive's root) to local
// and checks it against its manifest's size and SHA-256.
func (s *SSH) Fetch(ctx context.Context, key, local string, m *Manifest) error {
	f, err := os.Create(local)
	if err != nil {
		return err
	}
	h := sha256.New()
	cw := &counter{}
	err = s.stream(ctx, "exec cat -- "+ShellQuote(s.Remote(key)), nil, io.MultiWriter(f, h, cw))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("download %s: %w", s.URL(key), err)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); m.SHA256 != "" && (sum != m.SHA256 || cw.n != m.Bytes) {
		return fmt.Errorf("download %s: %d bytes sha256 %s, the manifest says %d bytes %s", s.URL(key), cw.n, sum, m.Bytes, m.SHA256)
	}
	return nil
}

type counter struct{ n int64 }

func (c *counter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

// ShellQuote quotes s for a POSIX shell.
func ShellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// fetchSSH lists an SSH archive, keeps what the selection wants and
// downloads it into a new temporary directory; the entries then name local
// files.
func fetchSSH(u string, sel Selection) ([]Entry, string, error) {
	s, err := ParseSSH(u, sel.SSHOptions)
	if err != nil {
		return nil, "", err
	}
	defer s.Close()
	ctx := context.Background()
	all, err := s.List(ctx)
	if err != nil {
		return nil, "", err
	}
	dir, err := os.MkdirTemp("", "magnet-ssh-archive-")
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
			key, err := s.key(e.Path)
			if err != nil {
				return nil, dir, err
			}
			local := filepath.Join(dir, filepath.FromSlash(key))
			if err := os.MkdirAll(filepath.Dir(local), 0o755); err != nil {
				return nil, dir, err
			}
			if err := s.Fetch(ctx, key, local, &e.Manifest); err != nil {
				return nil, dir, err
			}
			e.Path = local
			out = append(out, e)
		}
	}
	return out, dir, nil
}
