// SPDX-License-Identifier: Apache-2.0

package benchcmd

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseLinks(t *testing.T) {
	got, err := ParseLinks("unlimited, 1000,100mbit")
	if err != nil || !slices.Equal(got, []int{0, 1000, 100}) {
		t.Fatalf("ParseLinks = %v, %v", got, err)
	}
	if got, err := ParseLinks("none"); err != nil || len(got) != 0 {
		t.Fatalf("ParseLinks(none) = %v, %v", got, err)
	}
	for _, bad := range []string{"", "fast", "-5"} {
		if _, err := ParseLinks(bad); err == nil {
			t.Errorf("ParseLinks(%q) accepted", bad)
		}
	}
}

func TestParseConfigs(t *testing.T) {
	got, err := ParseConfigs("baseline,record-sender")
	if err != nil || !slices.Equal(got, []string{"baseline", "record-sender"}) {
		t.Fatalf("ParseConfigs = %v, %v", got, err)
	}
	if _, err := ParseConfigs("baseline,strace"); err == nil {
		t.Error("unknown configuration accepted")
	}
	got, err = ParseConfigs("record-sender-proc,record-sender-other")
	if err != nil || !slices.Equal(got, []string{"record-sender-proc", "record-sender-other"}) {
		t.Fatalf("ParseConfigs(process configurations) = %v, %v", got, err)
	}
}

func TestFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--reps", "0"},
		{"--links", "fast"},
		{"--configs", "nope"},
		{"--duration", "10ms"},
		{"--synth-producers", "0"},
	} {
		cmd := New()
		cmd.SetArgs(args)
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		if err := cmd.Execute(); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

func TestFindMagnet(t *testing.T) {
	if _, err := FindMagnet(filepath.Join(t.TempDir(), "no-such-magnet")); err == nil || !strings.HasPrefix(err.Error(), "--magnet: ") {
		t.Fatalf("a missing --magnet: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "magnet")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := FindMagnet(bin); err != nil || got != bin {
		t.Fatalf("FindMagnet(%s) = %q, %v", bin, got, err)
	}
}
