// SPDX-License-Identifier: Apache-2.0

package archive

import (
	"context"
	"fmt"
	"math"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/magnet-tracer/magnet/internal/trace"
)

// Flags are the selection flags of the analysis commands: --host, --since
// and --until.
type Flags struct {
	hosts        []string
	since, until string
	sshOptions   []string
}

// Register adds the flags to fs.
func (f *Flags) Register(fs *pflag.FlagSet) {
	fs.StringSliceVar(&f.hosts, "host", nil, "with a directory or archive: only these hosts (comma-separated)")
	fs.StringVar(&f.since, "since", "", "only events from this time on: 10:00, 2025-03-01T10:00, RFC 3339, or -1h (local time unless a zone is given)")
	fs.StringVar(&f.until, "until", "", "only events before this time (same forms as --since)")
	fs.StringArrayVar(&f.sshOptions, "ssh-option", nil, "with an ssh:// archive: an ssh -o option, e.g. IdentityFile=/etc/magnet/id_ed25519 (repeatable)")
}

// Selection parses the flags.
func (f *Flags) Selection(now time.Time) (Selection, error) {
	sel := Selection{Hosts: f.hosts, SSHOptions: f.sshOptions}
	var err error
	if f.since != "" {
		if sel.Since, err = ParseTime(f.since, now); err != nil {
			return sel, fmt.Errorf("--since: %w", err)
		}
	}
	if f.until != "" {
		if sel.Until, err = ParseTime(f.until, now); err != nil {
			return sel, fmt.Errorf("--until: %w", err)
		}
	}
	if !sel.Since.IsZero() && !sel.Until.IsZero() && !sel.Until.After(sel.Since) {
		return sel, fmt.Errorf("--until %s is not after --since %s", f.until, f.since)
	}
	return sel, nil
}

// ParseTime reads a time as a user types it: RFC 3339, 2006-01-02T15:04[:05],
// 2006-01-02 15:04[:05], 2006-01-02, 15:04[:05] (today), or a negative
// duration before now (-1h30m). Without a zone it is local time.
func ParseTime(s string, now time.Time) (time.Time, error) {
	t, err := parseTime(s, now)
	// Traces count time in int64 ns since the Unix epoch: beyond it a
	// time would wrap round and select the wrong events.
	if err == nil && (t.Before(time.Unix(0, math.MinInt64)) || t.After(time.Unix(0, math.MaxInt64))) {
		return time.Time{}, fmt.Errorf("time %q is outside 1678-2262, the range of ns since the Unix epoch that traces use", s)
	}
	return t, err
}

func parseTime(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "-") {
		d, err := time.ParseDuration(s[1:])
		if err == nil {
			return now.Add(-d), nil
		}
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	for _, layout := range []string{"2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02 15:04:05", "2006-01-02 15:04", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, now.Location()); err == nil {
			return t, nil
		}
	}
	for _, layout := range []string{"15:04:05", "15:04"} {
		if t, err := time.ParseInLocation(layout, s, now.Location()); err == nil {
			y, m, d := now.Date()
			return time.Date(y, m, d, t.Hour(), t.Minute(), t.Second(), 0, now.Location()), nil
		}
	}
	return time.Time{}, fmt.Errorf("bad time %q (want 10:00, 2025-03-01T10:00, RFC 3339 or -1h)", s)
}

// Resolve turns the arguments of an analysis command into the traces to
// read: a trace file as it is; a directory (an archive, a collect spool or
// any folder of traces) as the files the selection keeps; an s3://BUCKET/PREFIX
// or ssh://[USER@]HOST[:PORT]/PATH archive likewise, downloaded to a
// temporary directory first (and checked against its manifests). The rotated
// files of one recording become one chain, in order, whichever way they
// were given. cleanup removes what was downloaded; call it when done.
func Resolve(args []string, sel Selection) (srcs []trace.Source, cleanup func(), err error) {
	var entries []Entry
	var temps []string
	cleanup = func() {
		for _, d := range temps {
			os.RemoveAll(d)
		}
	}
	defer func() {
		if err != nil {
			cleanup()
		}
	}()
	for _, a := range args {
		if strings.HasPrefix(a, "s3://") || strings.HasPrefix(a, SSHScheme) {
			fetch := fetchS3
			if strings.HasPrefix(a, SSHScheme) {
				fetch = fetchSSH
			}
			es, dir, err := fetch(a, sel)
			if dir != "" {
				temps = append(temps, dir)
			}
			if err != nil {
				return nil, cleanup, err
			}
			entries = append(entries, es...)
			continue
		}
		fi, err := os.Stat(a)
		if err != nil {
			return nil, cleanup, fmt.Errorf("open trace: %w", err)
		}
		if fi.IsDir() {
			es, err := Scan(a)
			if err != nil {
				return nil, cleanup, err
			}
			if len(es) == 0 {
				return nil, cleanup, fmt.Errorf("%s holds no traces (.mgt or .mgt.zst)", a)
			}
			entries = append(entries, es...)
			continue
		}
		e, err := entryOf(a)
		if err != nil {
			return nil, cleanup, err
		}
		e.given = true
		entries = append(entries, *e)
	}
	// Files given one by one keep their order unless they form a chain.
	chains := Select(entries, sel)
	if sel.Skip != nil {
		chains = skipped(chains, sel.Skip)
	}
	if len(chains) == 0 {
		return nil, cleanup, fmt.Errorf("%w (%s)", ErrNoMatch, describe(sel))
	}
	for _, c := range chains {
		srcs = append(srcs, c.Source(sel))
	}
	return srcs, cleanup, nil
}

func describe(sel Selection) string {
	var parts []string
	if len(sel.Hosts) > 0 {
		parts = append(parts, "host "+strings.Join(sel.Hosts, ","))
	}
	if !sel.Since.IsZero() {
		parts = append(parts, "since "+sel.Since.Format(time.RFC3339))
	}
	if !sel.Until.IsZero() {
		parts = append(parts, "until "+sel.Until.Format(time.RFC3339))
	}
	if len(parts) == 0 {
		return "everything"
	}
	return strings.Join(parts, ", ")
}

// List returns every trace of an archive: a directory, s3://BUCKET/PREFIX or
// ssh://[USER@]HOST[:PORT]/PATH (its manifests only: nothing is
// downloaded). sshOptions are ssh -o options for an ssh:// archive.
func List(where string, sshOptions []string) ([]Entry, error) {
	return Find(where, Selection{SSHOptions: sshOptions})
}

// Find returns the traces of an archive that the selection may want (a
// superset: Select keeps the exact ones). From s3:// only the HOST/ and
// HOST/DATE/ prefixes the selection names are listed and read.
func Find(where string, sel Selection) ([]Entry, error) {
	sshOptions := sel.SSHOptions
	if strings.HasPrefix(where, "s3://") {
		return listS3(where, sel)
	}
	if strings.HasPrefix(where, SSHScheme) {
		s, err := ParseSSH(where, sshOptions)
		if err != nil {
			return nil, err
		}
		defer s.Close()
		return s.List(context.Background())
	}
	fi, err := os.Stat(where)
	if err != nil {
		return nil, fmt.Errorf("open archive: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%s is not a directory (an archive is a directory, s3://BUCKET/PREFIX or ssh://[USER@]HOST[:PORT]/PATH)", where)
	}
	return Scan(where)
}

// skipped drops the entries skip says to, and the chains left empty.
func skipped(chains []*Chain, skip func(*Entry) bool) []*Chain {
	var out []*Chain
	for _, c := range chains {
		var keep []Entry
		for i := range c.Entries {
			if !skip(&c.Entries[i]) {
				keep = append(keep, c.Entries[i])
			}
		}
		if len(keep) > 0 {
			c.Entries = keep
			out = append(out, c)
		}
	}
	return out
}
