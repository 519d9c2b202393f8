#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs every test: formatting, vet and staticcheck, the BPF object
# regenerated and compared with the committed one, all Go tests (as root,
# the BPF and namespace tests run for real; otherwise they skip and say
# why), and a short fuzz run.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/deps.sh

echo "== gofmt, go vet"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then echo "gofmt would change: $unformatted"; exit 1; fi
go vet ./...

echo "== staticcheck"
install_staticcheck
"$STATICCHECK" ./...

echo "== BPF objects and events.h's Go side match bpf/ (go generate)"
# tools/genevents writes internal/event/types_gen.go and catalogue_gen.go,
# internal/probe's layouts_gen.go and hookevents_gen.go, and
# bpf/events_btf.h; bpf2go the objects and their Go types. A generated file
# never committed (untracked) fails too, not only one that changed.
generated="internal/probe internal/kevent internal/event bpf/events_btf.h lab/internal/synthevent"
go generate ./internal/probe ./internal/kevent ./lab/internal/synthevent
untracked=$(git ls-files --others --exclude-standard -- $generated | grep -E '_gen\.go$|_bpfel[^/]*$|events_btf\.h$' || true)
if ! git diff --quiet -- $generated 2>/dev/null || [ -n "$untracked" ]; then
	echo "generated files differ from the committed ones: commit the output of 'go generate ./internal/probe ./internal/kevent ./lab/internal/synthevent'"
	git diff --stat -- $generated
	[ -z "$untracked" ] || echo "not committed: $untracked"
	exit 1
fi

echo "== no compiled program is committed"
# Only the BPF objects (*.o, regenerated above) may be ELF files: a built
# magnet or a test binary (46 MB once) belongs in .gitignore, not in git.
elf=$(git ls-files -z 2>/dev/null | while IFS= read -r -d '' f; do
	case $f in *.o) continue ;; esac
	[ -f "$f" ] && [ "$(head -c4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] && echo "$f"
done || true)
if [ -n "$elf" ]; then echo "compiled programs are committed: $elf"; exit 1; fi

echo "== the product carries no lab"
# magnet-lab's packages (lab/) are never linked into magnet (and probe's
# TestObjectHasNoLabPrograms keeps the lab's programs out of its object).
if lab=$(go list -deps ./cmd/magnet | grep '/lab/'); then
	echo "cmd/magnet depends on lab packages: $lab"
	exit 1
fi

echo "== go test"
mountpoint -q /sys/kernel/tracing 2>/dev/null || mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
go test -count=1 -timeout 15m ./... 2>&1 | tee /tmp/magnet-test.log

echo "== go test as an unprivileged user"
# Run as root, the step above cannot see a test that fails only without
# privileges (three daemon tests that need no BPF once did, although the
# README says such tests skip). Again as nobody, through go test -exec:
# root tests skip, the rest must pass. deploy is left out: its TestDeb
# fetches nfpm, which an offline module cache may not hold.
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
	unpriv=$(mktemp -d)
	chmod 755 "$unpriv"
	modcache=$(go env GOMODCACHE)
	# The modules the packages and their tests build from, from root's cache.
	GOMODCACHE="$unpriv/gomod" GOPROXY="file://$modcache/cache/download" GOFLAGS=-modcacherw go list -deps -test ./... >/dev/null
	chown -R 65534:65534 "$unpriv"
	MAGNET_UNPRIV_DIR=$unpriv go test -count=1 -timeout 15m -exec "$PWD/scripts/unprivileged.sh" $(go list ./... | grep -v '/deploy$') 2>&1 | tee /tmp/magnet-test-unprivileged.log
	rm -rf "$unpriv"
else
	echo "not root, or no setpriv: the run above was the unprivileged one"
fi

echo "== fuzz (short)"
# Budgets are counts of inputs, not seconds: with a -fuzztime in seconds,
# Go's fuzzing coordinator (before Go 1.27, go.dev/issue/75804) can fail a
# target with a bare "context deadline exceeded" at the deadline, having
# found nothing (CI did, on FuzzReportPair). The counts are about what each
# target ran in the 5-20 s it had here. Every input that finds new
# coverage is minimized first, here in at most 200 runs (the default, 60 s,
# took the whole short run of FuzzReader and FuzzExport: FuzzExport ran
# 2,199 inputs in 15 s and found none new; capped at 3 s, 23,706 and 6).
fuzz() { go test -run='^$' -fuzz="^$1\$" -fuzztime="$2" -fuzzminimizetime=200x "$3"; }
# Every fuzz target of the tree is in the list below: a new one is not
# forgotten.
self=$(cat scripts/test.sh)
for t in $(grep -rlE '^func Fuzz' --include='*_test.go' . | while read -r f; do
	for n in $(grep -oE '^func Fuzz[A-Za-z0-9_]+' "$f" | cut -c6-); do echo "$n:$(dirname "$f")"; done
done); do
	case $self in *"fuzz ${t%%:*} "*" ${t#*:}"*) ;; *) echo "fuzz target ${t%%:*} (${t#*:}) is not run by scripts/test.sh"; exit 1 ;; esac
done
fuzz FuzzReader 400000x ./internal/trace
fuzz FuzzExport 90000x ./internal/export
fuzz FuzzReport 20000x ./internal/analyze
fuzz FuzzParse 50000x ./internal/filter
fuzz FuzzParse 100000x ./internal/pcapfilter
fuzz FuzzDecodeMessage 200000x ./internal/availbw
fuzz FuzzReportPair 8000x ./internal/analyze
fuzz FuzzParseKeys 150000x ./internal/top
fuzz FuzzFormat 100000x ./internal/tpformat
fuzz FuzzParse 100000x ./internal/bytesize
fuzz FuzzParseStat 100000x ./internal/overhead
fuzz FuzzParseTriggers 100000x ./internal/flight
fuzz FuzzSocketInode 100000x ./internal/sockowner
fuzz FuzzCompile 100000x ./internal/pcapfilter
fuzz FuzzParseLinkDump 20000x ./internal/devskip
fuzz FuzzParseProcNetLine 20000x ./internal/record
fuzz FuzzParseProbe 20000x ./internal/availbw
fuzz FuzzGenerate 100000x ./tools/genevents
fuzz FuzzHubBatch 20000x ./internal/daemon
