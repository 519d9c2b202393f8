#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds magnet and records the built-in demo (the FTP pattern between two
# network namespaces), or the command given after --, then shows the trace
# and, for the demo, its modulation. As root (sudo in front from another
# user):
#   ./scripts/demo.sh                 # the demo
#   ./scripts/demo.sh -- curl -s http://127.0.0.1:8000/ -o /dev/null
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/deps.sh
go build -o bin/magnet ./cmd/magnet
if [ "${1:-}" = "--" ]; then
	shift
	bin/magnet record -o run.mgt -- "$@" || true
	bin/magnet parse --conns run.mgt
	bin/magnet parse run.mgt | head -20
else
	bin/magnet demo -o demo.mgt
fi
