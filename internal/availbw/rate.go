// SPDX-License-Identifier: Apache-2.0

package availbw

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ParseRate reads a bit rate: a number with an optional SI multiplier k,
// M, G or T (case-insensitive, powers of 1000) and an optional "bit",
// "bps" or "b/s": "100m", "1G", "2.5gbit", "800 Mb/s", "1e9".
func ParseRate(s string) (float64, error) {
	t := strings.ToLower(strings.ReplaceAll(strings.TrimSpace(s), " ", ""))
	for _, unit := range []string{"bit/s", "bits", "bit", "bps", "b/s"} {
		if rest, ok := strings.CutSuffix(t, unit); ok {
			t = rest
			break
		}
	}
	mult := 1.0
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'k':
			mult = 1e3
		case 'm':
			mult = 1e6
		case 'g':
			mult = 1e9
		case 't':
			mult = 1e12
		}
		if mult != 1 {
			t = t[:n-1]
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || t == "" {
		return 0, fmt.Errorf("rate %q: want a number of bit/s with an optional k, M, G or T (e.g. 100M)", s)
	}
	v *= mult
	if v <= 0 || math.IsInf(v, 0) || math.IsNaN(v) || v > 1e15 {
		return 0, fmt.Errorf("rate %q: want a positive rate up to 1000 Tb/s", s)
	}
	return v, nil
}

// Bound is an upper bound in bit/s; 0 means none was found, which JSON
// says as null: a reader must not take 0 for "unbounded" by convention.
type Bound float64

// MarshalJSON writes null for no bound.
func (b Bound) MarshalJSON() ([]byte, error) {
	if b <= 0 {
		return []byte("null"), nil
	}
	return json.Marshal(float64(b))
}

// UnmarshalJSON reads a number or null.
func (b *Bound) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		*b = 0
		return nil
	}
	var f float64
	if err := json.Unmarshal(data, &f); err != nil {
		return err
	}
	*b = Bound(f)
	return nil
}
