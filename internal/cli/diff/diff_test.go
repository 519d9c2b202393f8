// SPDX-License-Identifier: Apache-2.0

package diff

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/analyze"
)

const trace = "../../../testdata/bigendian.mgt"

func run(args ...string) (string, error) {
	cmd := New()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// A trace against itself: every row the same, none significant.
func TestDiffSelf(t *testing.T) {
	out, err := run(trace, trace)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "\n0 differences exceed the noise\n") || !strings.Contains(out, "connection 4097") {
		t.Errorf("output:\n%s", out)
	}
	js, err := run("--json", trace, trace)
	if err != nil {
		t.Fatal(err)
	}
	var d analyze.Diff
	if err := json.Unmarshal([]byte(js), &d); err != nil {
		t.Fatal(err)
	}
	if d.Significant != 0 || d.ConnA != 4097 || len(d.Figures) == 0 || len(d.Dists) == 0 {
		t.Errorf("json: %+v", d)
	}
}

// A missing file is one line of error, naming it.
func TestDiffBadInput(t *testing.T) {
	_, err := run(trace, "/nonexistent/b.mgt")
	if err == nil || !strings.HasPrefix(err.Error(), "diff: ") || !strings.Contains(err.Error(), "/nonexistent/b.mgt") {
		t.Errorf("error %v", err)
	}
	if _, err := run(trace); err == nil {
		t.Error("one trace accepted")
	}
}
