// SPDX-License-Identifier: Apache-2.0

package clidocs_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/magnet-tracer/magnet/internal/cli"
	"github.com/magnet-tracer/magnet/internal/clidocs"
)

var date = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

// Every visible command of the real tree gets exactly one page, named for
// its command path, describing its own flags; hidden ones get none.
func TestManPagesFollowTheTree(t *testing.T) {
	dir := t.TempDir()
	root := cli.NewRoot()
	names, err := clidocs.Man(root, dir, "1.2.3", date)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, c := range clidocs.Documented(root) {
		want = append(want, clidocs.ManPageName(c))
	}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("pages %v, want one per visible command %v", names, want)
	}
	for _, must := range []string{"magnet.1", "magnet-record.1", "magnet-parse.1", "magnet-export.1"} {
		if !slices.Contains(names, must) {
			t.Errorf("no %s among %v", must, names)
		}
	}
	for _, c := range root.Commands() {
		if c.Hidden && slices.Contains(names, clidocs.ManPageName(c)) {
			t.Errorf("hidden command %q got a page", c.Name())
		}
	}

	rec := read(t, filepath.Join(dir, "magnet-record.1"))
	for _, s := range []string{`.TH "MAGNET-RECORD" "1" "Nov 2026" "magnet 1.2.3" "magnet manual"`, `\fB--duration\fP`, `\fB--groups\fP`, "magnet(1)"} {
		if !strings.Contains(rec, s) {
			t.Errorf("magnet-record.1 lacks %q", s)
		}
	}
	top := read(t, filepath.Join(dir, "magnet.1"))
	for _, c := range clidocs.Documented(root)[1:] {
		if c.Parent() == root && !strings.Contains(top, strings.TrimSuffix(clidocs.ManPageName(c), ".1")) {
			t.Errorf("magnet.1 does not refer to %s", c.Name())
		}
	}
	if !strings.Contains(top, `\fB--version\fP`) {
		t.Error("magnet.1 does not document --version")
	}
	if strings.Contains(top, "Auto generated") {
		t.Error("magnet.1 carries a generation timestamp")
	}
	if _, err := exec.LookPath("man"); err == nil {
		out, err := exec.Command("man", "-l", "-P", "cat", filepath.Join(dir, "magnet-record.1")).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "magnet-record - Record network-stack events") {
			t.Errorf("man cannot render magnet-record.1: %v\n%s", err, out)
		}
	}
}

// The same tree, version and date give the same bytes (reproducible packages).
func TestManPagesReproducible(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	if _, err := clidocs.Man(cli.NewRoot(), a, "1.2.3", date); err != nil {
		t.Fatal(err)
	}
	if _, err := clidocs.Man(cli.NewRoot(), b, "1.2.3", date); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(a)
	for _, e := range entries {
		if !bytes.Equal([]byte(read(t, filepath.Join(a, e.Name()))), []byte(read(t, filepath.Join(b, e.Name())))) {
			t.Errorf("%s differs between two runs", e.Name())
		}
	}
}

// A command added to the tree gets its page and its completions with no
// other change: the point of generating them at build time.
func TestNewCommandDocumented(t *testing.T) {
	root := cli.NewRoot()
	added := &cobra.Command{Use: "collect", Short: "Record, rotate and ship, forever", RunE: func(*cobra.Command, []string) error { return nil }}
	added.Flags().String("config", "", "collector configuration file")
	root.AddCommand(added)
	dir := t.TempDir()
	names, err := clidocs.Man(root, dir, "1.2.3", date)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(names, "magnet-collect.1") {
		t.Fatalf("no page for an added command: %v", names)
	}
	if !strings.Contains(read(t, filepath.Join(dir, "magnet-collect.1")), `\fB--config\fP`) {
		t.Error("the added command's page lacks its flag")
	}
	// The scripts ask the binary (its __complete command) what to offer.
	if got := complete(t, root, ""); !slices.Contains(got, "collect") || !slices.Contains(got, "record") {
		t.Errorf("completing a subcommand offers %v, want collect and record among them", got)
	}
	if got := complete(t, root, "collect", "--c"); !slices.Contains(got, "--config") {
		t.Errorf("completing collect's flags offers %v, want --config", got)
	}
}

// complete runs what the completion scripts run: magnet __complete ARGS.
func complete(t *testing.T, root *cobra.Command, args ...string) []string {
	t.Helper()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&bytes.Buffer{})
	root.SetArgs(append([]string{cobra.ShellCompRequestCmd}, args...))
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	var words []string
	for _, line := range strings.Split(out.String(), "\n") {
		if line == "" || strings.HasPrefix(line, ":") {
			continue // the last line is ":<directive>"
		}
		words = append(words, strings.SplitN(line, "\t", 2)[0])
	}
	return words
}

// Each shell's script is for magnet and loads in that shell when it is
// installed (bash always is).
func TestCompletions(t *testing.T) {
	dir := t.TempDir()
	if err := clidocs.Completions(cli.NewRoot(), dir); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		file, shell, marker string
		load                string // sources the script, given as the first argument
	}{
		{clidocs.BashFile, "bash", "__start_magnet", `source "$0" && complete -p magnet`},
		{clidocs.ZshFile, "zsh", "#compdef magnet", `autoload -U compinit && compinit -u && source "$0"`},
		{clidocs.FishFile, "fish", "complete -c magnet", `source $argv[1] && complete -c magnet`},
	} {
		path := filepath.Join(dir, c.file)
		if s := read(t, path); !strings.Contains(s, c.marker) {
			t.Errorf("%s lacks %q", c.file, c.marker)
		}
		if _, err := exec.LookPath(c.shell); err != nil {
			t.Logf("%s not installed (scripts/deps.sh installs it): %s not loaded", c.shell, c.file)
			continue
		}
		args := []string{"-c", c.load, path}
		if c.shell == "fish" {
			args = []string{"-c", c.load, "--", path}
		}
		if out, err := exec.Command(c.shell, args...).CombinedOutput(); err != nil {
			t.Errorf("%s cannot load %s: %v\n%s", c.shell, c.file, err, out)
		}
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestOneFlagVocabulary: every command names event types --types and
// event groups --groups (docs/FILTERS.md); the old names (parse's
// --events for types, watch's --type) still parse but are not shown, and
// record's and the daemon's --events is read as their --groups.
func TestOneFlagVocabulary(t *testing.T) {
	root := cli.NewRoot()
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if f.Hidden {
				return
			}
			switch f.Name {
			case "events", "type", "group", "event", "event-types":
				t.Errorf("%s shows --%s: event types are --types, groups --groups", c.CommandPath(), f.Name)
			}
		})
		if c.Flags().Lookup("types") != nil && c.Flags().Lookup("groups") == nil {
			t.Errorf("%s has --types but no --groups", c.CommandPath())
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
	for _, path := range [][]string{{"record"}, {"daemon"}} {
		c, _, err := root.Find(path)
		if err != nil {
			t.Fatal(err)
		}
		fs := c.Flags()
		for _, arg := range []string{"--events=sock", "--groups=sock", "-e=sock"} {
			if err := fs.Parse([]string{arg}); err != nil {
				t.Errorf("%s %s: %v", path[0], arg, err)
			} else if g := fs.Lookup("groups"); !g.Changed || g.Value.String() != "sock" {
				t.Errorf("%s %s: --groups is %q (changed %v)", path[0], arg, g.Value, g.Changed)
			}
			fs.Lookup("groups").Changed = false
		}
	}
}
