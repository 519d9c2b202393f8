#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs every test: formatting and vet, the BPF object regenerated and compared
# with the committed one, all Go tests (as root, the BPF and namespace tests
# run for real; otherwise they skip and say why), and a short fuzz run.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/deps.sh

echo "== gofmt, go vet"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then echo "gofmt would change: $unformatted"; exit 1; fi
go vet ./...

echo "== BPF object matches bpf/ (go generate)"
go generate ./internal/probe
if ! git diff --quiet -- internal/probe 2>/dev/null; then
	echo "generated BPF files differ from the committed ones: commit the output of 'go generate ./internal/probe'"
	git diff --stat -- internal/probe
	exit 1
fi

echo "== go test"
mountpoint -q /sys/kernel/tracing 2>/dev/null || mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
go test -count=1 -timeout 15m ./... 2>&1 | tee /tmp/magnet-test.log

echo "== fuzz (short)"
# Every input that finds new coverage is minimized first, for up to
# -fuzzminimizetime (60 s by default), and a trace of a few KiB takes all of
# it: FuzzReader and FuzzExport spent their whole time minimizing the first
# input they found (FuzzExport, 15 s: 2,199 inputs run, none new; capped at
# 3 s: 23,706, 6 new).
go test -run='^$' -fuzz='^FuzzReader$' -fuzztime=20s -fuzzminimizetime=3s ./internal/trace
go test -run='^$' -fuzz='^FuzzExport$' -fuzztime=15s -fuzzminimizetime=3s ./internal/export
go test -run='^$' -fuzz='^FuzzReport$' -fuzztime=15s -fuzzminimizetime=5s ./internal/analyze
go test -run='^$' -fuzz='^FuzzParse$' -fuzztime=15s ./internal/filter
go test -run='^$' -fuzz='^FuzzDecodeMessage$' -fuzztime=10s ./internal/bwprobe
go test -run='^$' -fuzz='^FuzzReportPair$' -fuzztime=10s -fuzzminimizetime=5s ./internal/analyze
go test -run='^$' -fuzz='^FuzzParseKeys$' -fuzztime=5s ./internal/top
