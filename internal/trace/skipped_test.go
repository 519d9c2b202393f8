// SPDX-License-Identifier: Apache-2.0

package trace

import (
	"bytes"
	"testing"
)

// TestSummaryKernelSkipped: kernel_skipped is read back as written, 0
// included (a recording that compared and found nothing skipped), and is
// nil where a trace does not have it (written before it was counted:
// TestFixture's trace reads with none).
func TestSummaryKernelSkipped(t *testing.T) {
	for _, want := range []*uint64{nil, new(uint64), func() *uint64 { n := uint64(17); return &n }()} {
		h := testHeader(magnetTypes())
		var buf bytes.Buffer
		w, err := NewWriter(&buf, h, WriterOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Close(&Summary{KernelSkipped: want, Extra: map[string]any{"kernel_skipped_by_interface": map[string]any{"skipped": 17}}}); err != nil {
			t.Fatal(err)
		}
		r, err := NewReader(&buf)
		if err != nil {
			t.Fatal(err)
		}
		for {
			if _, err := r.Next(); err != nil {
				break
			}
		}
		s := r.Summary()
		if s == nil {
			t.Fatal("no summary")
		}
		switch {
		case want == nil && s.KernelSkipped != nil:
			t.Errorf("kernel_skipped %d, want none", *s.KernelSkipped)
		case want != nil && (s.KernelSkipped == nil || *s.KernelSkipped != *want):
			t.Errorf("kernel_skipped %v, want %d", s.KernelSkipped, *want)
		}
		if _, ok := s.Extra["kernel_skipped_by_interface"]; !ok {
			t.Error("no kernel_skipped_by_interface")
		}
	}
}
