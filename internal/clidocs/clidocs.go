// SPDX-License-Identifier: Apache-2.0

// Package clidocs writes what a package installs beside the binary to
// document it — man pages and shell completions — from the cobra command
// tree itself, so they describe exactly the commands the binary was built
// with: a subcommand added to the tree gets its page and its completions at
// the next build, with nothing to edit by hand.
package clidocs

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// Completion scripts, named as each shell looks them up: bash-completion
// loads completions/<command> on first use, zsh autoloads _<command> from
// its fpath, fish reads <command>.fish from vendor_completions.d.
const (
	BashFile = "magnet.bash" // installed as bash-completion/completions/magnet
	ZshFile  = "_magnet"
	FishFile = "magnet.fish"
)

// Man writes one man page (section 1) per visible command of root into dir
// — magnet.1, magnet-record.1, magnet-workload-send.1, … — and returns their
// names, sorted. Hidden commands, help topics and `help` get none. version
// goes into each page's footer and date into its header; with the same
// tree, version and date the pages are byte-for-byte the same (no "generated
// on" line), so packages built from the same source are reproducible.
func Man(root *cobra.Command, dir, version string, date time.Time) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("man pages: %w", err)
	}
	disableAutoGenTag(root)
	root.InitDefaultVersionFlag() // cobra adds --version only when executing
	date = date.UTC()
	header := &doc.GenManHeader{
		Section: "1",
		Date:    &date,
		Source:  "magnet " + version,
		Manual:  "magnet manual",
	}
	if err := doc.GenManTree(root, header, dir); err != nil {
		return nil, fmt.Errorf("man pages: %w", err)
	}
	names, err := filepath.Glob(filepath.Join(dir, "*.1"))
	if err != nil {
		return nil, fmt.Errorf("man pages: %w", err)
	}
	for i, n := range names {
		names[i] = filepath.Base(n)
	}
	sort.Strings(names)
	return names, nil
}

// Completions writes root's completion scripts for bash, zsh and fish into
// dir as BashFile, ZshFile and FishFile. They complete subcommands, flags
// and arguments by asking the installed binary (its hidden __complete
// command), so they stay right for the binary beside them.
func Completions(root *cobra.Command, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("completions: %w", err)
	}
	for _, c := range []struct {
		name string
		gen  func(f *os.File) error
	}{
		{BashFile, func(f *os.File) error { return root.GenBashCompletionV2(f, true) }},
		{ZshFile, func(f *os.File) error { return root.GenZshCompletion(f) }},
		{FishFile, func(f *os.File) error { return root.GenFishCompletion(f, true) }},
	} {
		if err := writeFile(filepath.Join(dir, c.name), c.gen); err != nil {
			return fmt.Errorf("completions: %w", err)
		}
	}
	return nil
}

// ManPageName is the man page Man writes for cmd: its command path with
// dashes (magnet-workload-send.1).
func ManPageName(cmd *cobra.Command) string {
	name := cmd.Name()
	for p := cmd.Parent(); p != nil; p = p.Parent() {
		name = p.Name() + "-" + name
	}
	return name + ".1"
}

// Documented lists the commands of root that get a man page: root and every
// available (not hidden, not help) command below it.
func Documented(root *cobra.Command) []*cobra.Command {
	out := []*cobra.Command{root}
	for _, c := range root.Commands() {
		if !c.IsAvailableCommand() || c.IsAdditionalHelpTopicCommand() {
			continue
		}
		out = append(out, Documented(c)...)
	}
	return out
}

func disableAutoGenTag(cmd *cobra.Command) {
	cmd.DisableAutoGenTag = true
	for _, c := range cmd.Commands() {
		disableAutoGenTag(c)
	}
}

func writeFile(path string, gen func(*os.File) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := gen(f); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}
