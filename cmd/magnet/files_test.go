// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// copyFixture copies the test trace into dir and returns its path and
// content.
func copyFixture(t *testing.T, dir, name string) (string, []byte) {
	t.Helper()
	b, err := os.ReadFile(exportFixture)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p, b
}

func sameContent(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s was overwritten (%d bytes, was %d)", path, len(got), len(want))
	}
}

// An output that is an input, by its name, a symbolic link or a hard link,
// is refused before anything is written.
func TestOutputIsInput(t *testing.T) {
	dir := t.TempDir()
	in, orig := copyFixture(t, dir, "in.mgt")
	link := filepath.Join(dir, "chart.svg")
	if err := os.Symlink(in, link); err != nil {
		t.Fatal(err)
	}
	hard := filepath.Join(dir, "hard.csv")
	if err := os.Link(in, hard); err != nil {
		t.Fatal(err)
	}
	cases := [][]string{
		{"export", in, "-f", "csv", "-o", in},
		{"export", in, "-f", "csv", "-o", hard},
		{"export", in, "-f", "pcapng", "-o", in},
		{"export", in, "-f", "perfetto", "-o", in},
		{"export", in, "-f", "csv", "-o", filepath.Join(dir, "out.csv"), "--conns-output", in},
		{"export", in, "-f", "csv", "-o", filepath.Join(dir, "same.csv"), "--conns-output", filepath.Join(dir, "same.csv")},
		{"plot", in, "-o", link},
		{"report", in, "--html", link},
	}
	for _, args := range cases {
		r := magnet(t, args...)
		oneLineError(t, r, "refusing to overwrite what it reads")
		sameContent(t, in, orig)
	}
}
