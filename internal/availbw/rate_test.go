// SPDX-License-Identifier: Apache-2.0

package availbw

import "testing"

func TestParseRate(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want float64
	}{
		{"100m", 100e6}, {"1G", 1e9}, {"2.5gbit", 2.5e9}, {"800 Mb/s", 800e6}, {"1e9", 1e9},
		{"64k", 64e3}, {"10Mbps", 10e6}, {"5000", 5000}, {"1T", 1e12}, {" 3M ", 3e6},
	} {
		got, err := ParseRate(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseRate(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "fast", "-1M", "0", "M", "1X", "inf", "NaN", "1e400", "2000T"} {
		if _, err := ParseRate(bad); err == nil {
			t.Errorf("ParseRate(%q) accepted", bad)
		}
	}
}
