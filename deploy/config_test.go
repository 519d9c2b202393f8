// SPDX-License-Identifier: Apache-2.0

package deploy_test

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The default configuration files are YAML with the documented defaults, and
// collect.yaml shows an example of each kind of archive.
func TestDefaultConfigs(t *testing.T) {
	var collect struct {
		Output     string         `yaml:"output"`
		Rotate     string         `yaml:"rotate"`
		RotateSize string         `yaml:"rotate-size"`
		Keep       int            `yaml:"keep"`
		Events     string         `yaml:"events"`
		Ship       map[string]any `yaml:"ship"`
	}
	raw := read(t, filepath.Join(repo, "deploy/config/collect.yaml"))
	if err := yaml.Unmarshal(raw, &collect); err != nil {
		t.Fatalf("collect.yaml: %v", err)
	}
	if filepath.Dir(collect.Output) != "/var/lib/magnet" || collect.Rotate != "1h" || collect.RotateSize != "1GiB" || collect.Keep != 48 || collect.Events != "default" {
		t.Errorf("collect.yaml defaults: %+v", collect)
	}
	if collect.Ship != nil {
		t.Error("shipping is on by default; it needs an archive configured first")
	}
	for _, example := range []string{"#   to: /srv/", "#   to: ssh://", "#   to: s3://"} {
		if !strings.Contains(string(raw), example) {
			t.Errorf("collect.yaml has no %q example", example)
		}
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
