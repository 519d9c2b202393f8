// SPDX-License-Identifier: Apache-2.0

package deploy_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/magnet-tracer/magnet/internal/collect"
)

// The parts of Kubernetes objects the tests look at (unknown fields are
// ignored; the tests check what they need is there and right).
type object struct {
	APIVersion string            `yaml:"apiVersion"`
	Kind       string            `yaml:"kind"`
	Metadata   meta              `yaml:"metadata"`
	Data       map[string]string `yaml:"data"`
	Spec       daemonSetSpec     `yaml:"spec"`
}

type meta struct {
	Name      string            `yaml:"name"`
	Namespace string            `yaml:"namespace"`
	Labels    map[string]string `yaml:"labels"`
}

type daemonSetSpec struct {
	Selector struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	} `yaml:"selector"`
	UpdateStrategy struct {
		Type string `yaml:"type"`
	} `yaml:"updateStrategy"`
	Template struct {
		Metadata meta    `yaml:"metadata"`
		Spec     podSpec `yaml:"spec"`
	} `yaml:"template"`
}

type podSpec struct {
	HostPID                      bool   `yaml:"hostPID"`
	HostNetwork                  bool   `yaml:"hostNetwork"`
	DNSPolicy                    string `yaml:"dnsPolicy"`
	AutomountServiceAccountToken *bool  `yaml:"automountServiceAccountToken"`
	TerminationGracePeriod       int    `yaml:"terminationGracePeriodSeconds"`
	Tolerations                  []struct {
		Operator string `yaml:"operator"`
	} `yaml:"tolerations"`
	Containers []container `yaml:"containers"`
	Volumes    []struct {
		Name      string `yaml:"name"`
		ConfigMap *struct {
			Name string `yaml:"name"`
		} `yaml:"configMap"`
		HostPath *struct {
			Path string `yaml:"path"`
			Type string `yaml:"type"`
		} `yaml:"hostPath"`
	} `yaml:"volumes"`
}

type container struct {
	Name            string   `yaml:"name"`
	Image           string   `yaml:"image"`
	Command         []string `yaml:"command"`
	Args            []string `yaml:"args"`
	SecurityContext struct {
		Privileged               *bool `yaml:"privileged"`
		RunAsUser                *int  `yaml:"runAsUser"`
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
			Add  []string `yaml:"add"`
		} `yaml:"capabilities"`
		SeccompProfile struct {
			Type string `yaml:"type"`
		} `yaml:"seccompProfile"`
	} `yaml:"securityContext"`
	Resources struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		ReadOnly  bool   `yaml:"readOnly"`
	} `yaml:"volumeMounts"`
}

func manifest(t *testing.T) map[string]object {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader(read(t, filepath.Join(repo, "deploy/kubernetes/magnet-collect.yaml"))))
	objs := map[string]object{}
	for {
		var o object
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("magnet-collect.yaml: %v", err)
		}
		if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
			t.Fatalf("an object without apiVersion, kind or name: %+v", o)
		}
		if o.Kind != "Namespace" && o.Metadata.Namespace != "magnet" {
			t.Errorf("%s %s in namespace %q, want magnet", o.Kind, o.Metadata.Name, o.Metadata.Namespace)
		}
		objs[o.Kind] = o
	}
	return objs
}

// The DaemonSet runs one unprivileged collector per node with exactly the
// capabilities, host namespaces and host mounts magnet needs, each mount
// read-only unless magnet writes there.
func TestDaemonSet(t *testing.T) {
	objs := manifest(t)
	for _, kind := range []string{"Namespace", "ConfigMap", "DaemonSet"} {
		if _, ok := objs[kind]; !ok {
			t.Fatalf("no %s in the manifest", kind)
		}
	}
	ds := objs["DaemonSet"]
	if ds.APIVersion != "apps/v1" {
		t.Errorf("DaemonSet apiVersion %s", ds.APIVersion)
	}
	for k, v := range ds.Spec.Selector.MatchLabels {
		if ds.Spec.Template.Metadata.Labels[k] != v {
			t.Errorf("selector %s=%s does not match the pod template's labels %v", k, v, ds.Spec.Template.Metadata.Labels)
		}
	}
	if len(ds.Spec.Selector.MatchLabels) == 0 {
		t.Error("empty selector")
	}
	if ds.Spec.UpdateStrategy.Type != "RollingUpdate" {
		t.Errorf("updateStrategy %q", ds.Spec.UpdateStrategy.Type)
	}

	pod := ds.Spec.Template.Spec
	if !pod.HostPID || !pod.HostNetwork || pod.DNSPolicy != "ClusterFirstWithHostNet" {
		t.Errorf("hostPID %v hostNetwork %v dnsPolicy %q: want the host's PIDs and network, cluster DNS", pod.HostPID, pod.HostNetwork, pod.DNSPolicy)
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("the collector needs no API token: automountServiceAccountToken: false")
	}
	if len(pod.Tolerations) == 0 || pod.Tolerations[0].Operator != "Exists" {
		t.Error("not tolerating every taint: some nodes would go unrecorded")
	}
	if pod.TerminationGracePeriod < 60 {
		t.Errorf("terminationGracePeriodSeconds %d: too short to close a file", pod.TerminationGracePeriod)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	if got := strings.Join(append(c.Command, c.Args...), " "); got != "/usr/bin/magnet collect --config /etc/magnet/collect.yaml" {
		t.Errorf("runs %q", got)
	}
	if c.Image == "" {
		t.Error("no image")
	}

	sc := c.SecurityContext
	if sc.Privileged == nil || *sc.Privileged {
		t.Error("privileged must be spelled out false")
	}
	if sc.RunAsUser == nil || *sc.RunAsUser != 0 {
		t.Error("runAsUser must be 0: added capabilities are effective for root only")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("allowPrivilegeEscalation must be false")
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("readOnlyRootFilesystem must be true")
	}
	if !slices.Equal(sc.Capabilities.Drop, []string{"ALL"}) {
		t.Errorf("drops %v, want ALL", sc.Capabilities.Drop)
	}
	var caps []string
	for _, c := range sc.Capabilities.Add {
		caps = append(caps, "CAP_"+c)
	}
	slices.Sort(caps)
	if !slices.Equal(caps, wantCaps) {
		t.Errorf("adds %v, want %v (as the systemd units)", caps, wantCaps)
	}
	if sc.SeccompProfile.Type == "" {
		t.Error("no seccomp profile spelled out")
	}

	if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" || c.Resources.Limits["memory"] == "" {
		t.Errorf("resources %+v: want cpu and memory requests and a memory limit", c.Resources)
	}
	if _, ok := c.Resources.Limits["cpu"]; ok {
		t.Error("a CPU limit throttles the reader and loses events")
	}

	// mount path → host path, and whether the container may write there.
	want := map[string]struct {
		host     string
		readOnly bool
	}{
		"/sys/fs/bpf":         {"/sys/fs/bpf", false},
		"/sys/kernel/tracing": {"/sys/kernel/tracing", true},
		"/sys/fs/cgroup":      {"/sys/fs/cgroup", true},
		"/sys/kernel/btf":     {"/sys/kernel/btf", true},
		"/var/lib/magnet":     {"/var/lib/magnet", false},
		"/run/magnet":         {"/run/magnet", false},
	}
	hostPaths := map[string]string{}
	configMaps := map[string]string{}
	for _, v := range pod.Volumes {
		switch {
		case v.HostPath != nil:
			hostPaths[v.Name] = v.HostPath.Path
		case v.ConfigMap != nil:
			configMaps[v.Name] = v.ConfigMap.Name
		}
	}
	seen := map[string]bool{}
	for _, m := range c.VolumeMounts {
		seen[m.MountPath] = true
		if m.MountPath == "/etc/magnet" {
			if configMaps[m.Name] != objs["ConfigMap"].Metadata.Name || !m.ReadOnly {
				t.Errorf("/etc/magnet: want the ConfigMap, read-only; got volume %q", m.Name)
			}
			continue
		}
		w, ok := want[m.MountPath]
		if !ok {
			t.Errorf("unexpected mount %s", m.MountPath)
			continue
		}
		if hostPaths[m.Name] != w.host {
			t.Errorf("%s: from host path %q, want %s", m.MountPath, hostPaths[m.Name], w.host)
		}
		if m.ReadOnly != w.readOnly {
			t.Errorf("%s: readOnly %v, want %v", m.MountPath, m.ReadOnly, w.readOnly)
		}
	}
	for p := range want {
		if !seen[p] {
			t.Errorf("no mount of the host's %s", p)
		}
	}
	if !seen["/etc/magnet"] {
		t.Error("the configuration is not mounted at /etc/magnet")
	}

	// The ConfigMap's configuration is one `magnet collect` accepts, ships
	// to object storage and otherwise keeps the defaults of
	// deploy/config/collect.yaml.
	cfg, err := collect.Parse([]byte(objs["ConfigMap"].Data["collect.yaml"]))
	if err != nil {
		t.Fatalf("ConfigMap collect.yaml: %v", err)
	}
	defaults, err := collect.Parse(read(t, filepath.Join(repo, "deploy/config/collect.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Spool != defaults.Spool || cfg.Pattern != defaults.Pattern || cfg.Rotate != defaults.Rotate || cfg.Events != defaults.Events || cfg.Ship != defaults.Ship {
		t.Errorf("ConfigMap collect.yaml differs from the defaults: %+v", cfg)
	}
	if len(cfg.Targets) != 1 || cfg.Targets[0].Type != "s3" || cfg.Targets[0].AccessKeyEnv == "" {
		t.Errorf("the cluster ships to %+v, want one s3 archive with credentials from the environment", cfg.Targets)
	}
}

// The image recipe builds the static binary in one stage and copies it, and
// the default configuration, alone into a minimal one, at the path the
// DaemonSet runs.
func TestContainerfile(t *testing.T) {
	var froms, copies []string
	var build string
	sc := bufio.NewScanner(bytes.NewReader(read(t, filepath.Join(repo, "Containerfile"))))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "FROM "):
			froms = append(froms, line)
		case strings.HasPrefix(line, "COPY "):
			copies = append(copies, line)
		case strings.Contains(line, "CGO_ENABLED=0 go build"):
			build = line
		}
	}
	if len(froms) != 2 || !strings.HasSuffix(froms[0], " AS build") || !strings.Contains(froms[1], "distroless/static") {
		t.Errorf("stages %q: want a build stage and a distroless/static one", froms)
	}
	if build == "" {
		t.Error("no CGO_ENABLED=0 go build")
	}
	if !slices.Contains(copies, "COPY --from=build /out/magnet /usr/bin/magnet") {
		t.Errorf("the binary is not copied to /usr/bin/magnet: %q", copies)
	}
	if !slices.Contains(copies, "COPY deploy/config/collect.yaml deploy/config/magnetd.yaml /etc/magnet/") {
		t.Errorf("the default configuration is not copied to /etc/magnet: %q", copies)
	}
}
