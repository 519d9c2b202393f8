// SPDX-License-Identifier: Apache-2.0

package deploy_test

import (
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	collectpkg "github.com/magnet-tracer/magnet/internal/collect"
	daemonpkg "github.com/magnet-tracer/magnet/internal/daemon"
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

	// magnetd.yaml is what `magnet daemon` itself accepts (its loader
	// rejects unknown keys), showing exactly the defaults.
	path := filepath.Join(repo, "deploy/config/magnetd.yaml")
	daemon, err := daemonpkg.LoadConfig(path)
	if err == nil {
		err = daemon.Check()
	}
	if err != nil {
		t.Fatalf("magnetd.yaml: %v", err)
	}
	if !reflect.DeepEqual(daemon, daemonpkg.DefaultConfig()) {
		t.Errorf("magnetd.yaml shows other values than the defaults:\n%+v\nwant\n%+v", daemon, daemonpkg.DefaultConfig())
	}
	raw = read(t, path)
	if !strings.Contains(string(raw), "127.0.0.1:9437") {
		t.Error("magnetd.yaml does not show the loopback listener address")
	}
}
