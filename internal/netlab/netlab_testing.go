// SPDX-License-Identifier: Apache-2.0

package netlab

import "testing"

// ForTest builds a Lab for a test or benchmark and deletes it when the test
// ends. It skips the test, with the reason from Available, when labs cannot
// be built here, and fails it when setup goes wrong on a system that should
// support it.
func ForTest(tb testing.TB, opts Options) *Lab {
	tb.Helper()
	if err := Available(); err != nil {
		tb.Skip(err)
	}
	l, err := New(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := l.Close(); err != nil {
			tb.Error(err)
		}
	})
	return l
}

// PathForTest builds a Path for a test or benchmark and deletes it when the
// test ends, skipping and failing as ForTest does.
func PathForTest(tb testing.TB, opts PathOptions) *Path {
	tb.Helper()
	if err := Available(); err != nil {
		tb.Skip(err)
	}
	p, err := NewPath(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := p.Close(); err != nil {
			tb.Error(err)
		}
	})
	return p
}
