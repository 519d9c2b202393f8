// SPDX-License-Identifier: Apache-2.0

package deploy_test

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	collectpkg "github.com/magnet-tracer/magnet/internal/collect"
)

// The default configuration files are YAML with the documented defaults, and
// collect.yaml shows an example of each kind of archive.
func TestDefaultConfigs(t *testing.T) {
	// collect.yaml is what `magnet collect` itself accepts (its loader
	// rejects unknown keys), with the documented defaults.
	raw := read(t, filepath.Join(repo, "deploy/config/collect.yaml"))
	collect, err := collectpkg.Parse(raw)
	if err != nil {
		t.Fatalf("collect.yaml: %v", err)
	}
	if collect.Spool != collectpkg.DefaultSpool || collect.Pattern != collectpkg.DefaultPattern || collect.Rotate.Interval != time.Hour || collect.Events != "default" {
		t.Errorf("collect.yaml defaults: %+v", collect)
	}
	if len(collect.Targets) != 0 {
		t.Error("shipping is on by default; it needs an archive configured first")
	}
	// Each commented example, uncommented, is a valid configuration.
	var examples strings.Builder
	_, targets, _ := strings.Cut(string(raw), "\n# targets:")
	examples.WriteString("targets:\n")
	for _, line := range strings.Split(targets, "\n") {
		if strings.HasPrefix(line, "#   ") {
			examples.WriteString(strings.TrimPrefix(line, "# ") + "\n")
		}
	}
	withTargets, err := collectpkg.Parse(append(raw, examples.String()...))
	if err != nil {
		t.Fatalf("collect.yaml with its examples uncommented: %v", err)
	}
	var types []string
	for _, tg := range withTargets.Targets {
		types = append(types, tg.Type)
	}
	if !slices.Equal(types, []string{"dir", "ssh", "s3"}) {
		t.Errorf("collect.yaml examples: targets %v, want dir, ssh and s3", types)
	}

	var daemon struct {
		Socket      string `yaml:"socket"`
		SeeAllGroup string `yaml:"see-all-group"`
		TCP         struct {
			Listen    string `yaml:"listen"`
			TokenFile string `yaml:"token-file"`
		} `yaml:"tcp"`
		Metrics struct {
			Enabled bool `yaml:"enabled"`
		} `yaml:"metrics"`
		Baseline []string `yaml:"baseline"`
	}
	raw = read(t, filepath.Join(repo, "deploy/config/magnetd.yaml"))
	if err := yaml.Unmarshal(raw, &daemon); err != nil {
		t.Fatalf("magnetd.yaml: %v", err)
	}
	if daemon.Socket != "/run/magnet.sock" || daemon.TCP.Listen != "" || daemon.Metrics.Enabled || !slices.Equal(daemon.Baseline, []string{"conn"}) {
		t.Errorf("magnetd.yaml defaults: %+v", daemon)
	}
	if !strings.Contains(string(raw), "127.0.0.1:9437") {
		t.Error("magnetd.yaml does not show the loopback listener address")
	}
}
