// SPDX-License-Identifier: Apache-2.0

package machine

import (
	"runtime"
	"strings"
	"testing"
)

// Read finds what every Linux host has: its cores, kernel and CPU model.
func TestRead(t *testing.T) {
	m := Read()
	if m.Cores != runtime.NumCPU() || !strings.HasPrefix(m.Kernel, "Linux ") || m.CPU == "" {
		t.Fatalf("Read() = %+v", m)
	}
}

// LoadAvg reads three non-negative averages.
func TestLoadAvg(t *testing.T) {
	l := LoadAvg()
	for _, v := range l {
		if v < 0 {
			t.Fatalf("LoadAvg() = %v", l)
		}
	}
}
