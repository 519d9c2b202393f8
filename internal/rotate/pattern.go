// SPDX-License-Identifier: Apache-2.0

package rotate

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Pattern is an output file name with strftime-like verbs, expanded each
// time a new file starts:
//
//	%Y  year (2006)            %m  month (01-12)        %d  day (01-31)
//	%H  host name, or the hour (00-23) once %Y, %m or %d came before it
//	%M  minute (00-59)         %S  second (00-59)       %s  Unix seconds
//	%h  host name (always)     %n  file number in the recording (0000)
//	%%  a per cent sign
//
// Times are UTC. So "/var/lib/magnet/%H-%Y%m%dT%H%M%S.mgt" gives
// /var/lib/magnet/web1-20250301T100000.mgt. Verbs are allowed in the file
// name only, not in the directory.
type Pattern struct {
	Dir   string
	base  string
	host  string
	verbs []verb // the base name, parsed
	match *regexp.Regexp
}

type verb struct {
	lit  string // literal text, when code is 0
	code byte   // Y m d H(hour) M S s h(host) n
}

// ParsePattern checks pattern and prepares it for host.
func ParsePattern(pattern, host string) (*Pattern, error) {
	dir, base := filepath.Split(pattern)
	if strings.Contains(dir, "%") {
		return nil, fmt.Errorf("output pattern %q: verbs (%%) are allowed in the file name only", pattern)
	}
	if base == "" || strings.HasPrefix(base, ".") {
		return nil, fmt.Errorf("output pattern %q: want a file name that does not start with a dot", pattern)
	}
	if dir == "" {
		dir = "."
	}
	p := &Pattern{Dir: filepath.Clean(dir), base: base, host: sanitizeHost(host)}
	re := "^"
	dated := false
	for i := 0; i < len(base); i++ {
		c := base[i]
		if c != '%' {
			p.verbs = append(p.verbs, verb{lit: string(c)})
			re += regexp.QuoteMeta(string(c))
			continue
		}
		if i+1 == len(base) {
			return nil, fmt.Errorf("output pattern %q: it ends in a lone %%", pattern)
		}
		i++
		code := base[i]
		switch code {
		case '%':
			p.verbs = append(p.verbs, verb{lit: "%"})
			re += "%"
			continue
		case 'Y', 'm', 'd':
			dated = true
			re += `\d+`
		case 'M', 'S', 's', 'n':
			re += `\d+`
		case 'H':
			if !dated {
				code = 'h'
				re += `[^/]+`
			} else {
				re += `\d+`
			}
		case 'h':
			re += `[^/]+`
		default:
			return nil, fmt.Errorf("output pattern %q: unknown verb %%%c (want %%Y %%m %%d %%H %%M %%S %%s %%h %%n or %%%%)", pattern, code)
		}
		p.verbs = append(p.verbs, verb{code: code})
	}
	// A second file started within the same second gets "-N" before the
	// extension (see Expand).
	ext := filepath.Ext(base)
	if ext != "" && strings.HasSuffix(re, regexp.QuoteMeta(ext)) {
		re = strings.TrimSuffix(re, regexp.QuoteMeta(ext)) + `(-\d+)?` + regexp.QuoteMeta(ext)
	} else {
		re += `(-\d+)?`
	}
	p.match = regexp.MustCompile(re + "$")
	return p, nil
}

// Expand returns the path of file number seq started at t.
func (p *Pattern) Expand(t time.Time, seq int) string {
	t = t.UTC()
	var b strings.Builder
	for _, v := range p.verbs {
		switch v.code {
		case 0:
			b.WriteString(v.lit)
		case 'Y':
			fmt.Fprintf(&b, "%04d", t.Year())
		case 'm':
			fmt.Fprintf(&b, "%02d", int(t.Month()))
		case 'd':
			fmt.Fprintf(&b, "%02d", t.Day())
		case 'H':
			fmt.Fprintf(&b, "%02d", t.Hour())
		case 'M':
			fmt.Fprintf(&b, "%02d", t.Minute())
		case 'S':
			fmt.Fprintf(&b, "%02d", t.Second())
		case 's':
			b.WriteString(strconv.FormatInt(t.Unix(), 10))
		case 'h':
			b.WriteString(p.host)
		case 'n':
			fmt.Fprintf(&b, "%04d", seq)
		}
	}
	return filepath.Join(p.Dir, b.String())
}

// Unique returns path, or path with "-N" before its extension when path is
// taken (exists, or taken reports it).
func Unique(path string, taken func(string) bool) string {
	ext := filepath.Ext(path)
	stem := strings.TrimSuffix(path, ext)
	cand := path
	for i := 1; ; i++ {
		if _, err := os.Lstat(cand); os.IsNotExist(err) && !taken(cand) {
			return cand
		}
		cand = fmt.Sprintf("%s-%d%s", stem, i, ext)
	}
}

// Matches reports whether base (a file name without directory) is one this
// pattern could have produced.
func (p *Pattern) Matches(base string) bool { return p.match.MatchString(base) }

// sanitizeHost keeps a host name usable in a file name.
func sanitizeHost(h string) string {
	if h == "" {
		h = "localhost"
	}
	return strings.Map(func(r rune) rune {
		if r == '/' || r == 0 || r == '%' || r < ' ' {
			return '_'
		}
		return r
	}, h)
}
