#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs what building and testing magnet needs on Debian/Ubuntu: clang and
# LLVM (BPF compiler), libbpf headers, iproute2 (namespaces, tc) and Go.
set -euo pipefail
need=()
command -v clang >/dev/null || need+=(clang)
command -v llvm-strip >/dev/null || need+=(llvm)
[ -f /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
command -v ip >/dev/null || need+=(iproute2)
command -v tc >/dev/null || need+=(iproute2)
command -v go >/dev/null || need+=(golang-go)
command -v tshark >/dev/null || need+=(tshark) # reads the pcapng export in the tests
command -v tcpdump >/dev/null || need+=(tcpdump) # the wire's truth in the report's tests
command -v nstat >/dev/null || need+=(iproute2)  # the kernel's TCP counters in the report's tests
# Packaging: make install / make deb, the .deb read back, the generated
# completions loaded in each shell.
command -v make >/dev/null || need+=(make)
command -v dpkg-deb >/dev/null || need+=(dpkg)
command -v zsh >/dev/null || need+=(zsh)
command -v fish >/dev/null || need+=(fish)
# The collect tests ship to a real sshd on loopback.
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null || need+=(openssh-client)
command -v tmux >/dev/null || need+=(tmux)         # magnet top in a real terminal, in the tests
command -v chromium >/dev/null || need+=(chromium) # the daemon's oscilloscope page, in the tests
command -v bpftrace >/dev/null || need+=(bpftrace) # the bench's peer tracer, and the tests' witness of the device tracepoints (internal/witness)
command -v bpftool >/dev/null || need+=(bpftool)   # the witness reads its programs' recursion misses through it
# The conformance tests (internal/conformance) run real programs between
# namespaces and check magnet against tcpdump/tshark, nstat, ss and tc.
command -v iperf3 >/dev/null || need+=(iperf3)
[ -x /usr/sbin/nginx ] || command -v nginx >/dev/null || need+=(nginx-light)
command -v curl >/dev/null || need+=(curl)
command -v tcpdump >/dev/null || need+=(tcpdump)
command -v nstat >/dev/null || need+=(iproute2)
command -v ss >/dev/null || need+=(iproute2)
command -v nsenter >/dev/null || need+=(util-linux)
# chrt: timing tests run their helpers at real-time priority.
command -v chrt >/dev/null || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" != 0 ]; then
		echo "deps: missing ${need[*]}: run this as root (or sudo in front) to install them with apt" >&2
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	# A policy-rc.d that says no: installing nginx or iperf3 must not start
	# their services (the tests start their own, in namespaces).
	norc=
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && norc=1
	fi
	apt-get install -y -qq "${need[@]}" >/dev/null
	[ -z "$norc" ] || rm -f /usr/sbin/policy-rc.d
fi
# pyarrow reads magnet's Parquet exports back in the tests.
python3 -c 'import pyarrow' 2>/dev/null || python3 -m pip install --quiet pyarrow 2>/dev/null ||
	{ command -v pip3 >/dev/null || { apt-get install -y -qq python3-pip >/dev/null; }; python3 -m pip install --quiet --break-system-packages pyarrow; }
# DuckDB runs the dataset queries of docs/DEPLOY.md (internal/export's
# TestDatasetDuckDB); scripts/spark-dataset.sh adds pyspark, slower.
python3 -c 'import duckdb' 2>/dev/null || python3 -m pip install --quiet duckdb 2>/dev/null ||
	python3 -m pip install --quiet --break-system-packages duckdb
# moto_server is the S3-compatible object store the collect tests ship to.
command -v moto_server >/dev/null || python3 -m pip install --quiet 'moto[server]' 2>/dev/null ||
	python3 -m pip install --quiet --break-system-packages 'moto[server]'
# Debian's Go may be older than go.mod asks for: let the go command fetch
# the toolchain go.mod names from the module proxy.
export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
# staticcheck, pinned so that CI's verdict does not change under us; 0.8
# (2026.2) is the first release that reads Go 1.26 code. Only the tests run
# it (scripts/test.sh calls this), so the demo does not wait for its build.
# It goes where `go install` puts it; the path is in STATICCHECK.
STATICCHECK_VERSION=0.8.2
install_staticcheck() {
	STATICCHECK="$(go env GOBIN)"
	STATICCHECK="${STATICCHECK:-$(go env GOPATH)/bin}/staticcheck"
	"$STATICCHECK" -version 2>/dev/null | grep -qF "($STATICCHECK_VERSION)" ||
		go install "honnef.co/go/tools/cmd/staticcheck@v$STATICCHECK_VERSION"
	export STATICCHECK
}
