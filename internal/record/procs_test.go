// SPDX-License-Identifier: Apache-2.0

package record

import (
	"runtime"
	"testing"
)

func TestOneProc(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(before)
	runtime.GOMAXPROCS(2)
	t.Setenv("GOMAXPROCS", "2") // the user's choice stands
	OneProc()
	if n := runtime.GOMAXPROCS(0); n != 2 {
		t.Fatalf("GOMAXPROCS %d after OneProc with GOMAXPROCS=2 set, want 2", n)
	}
	t.Setenv("GOMAXPROCS", "")
	OneProc()
	if n := runtime.GOMAXPROCS(0); n != 1 {
		t.Fatalf("GOMAXPROCS %d after OneProc, want 1", n)
	}
}
