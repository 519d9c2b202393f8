#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds magnet as it was at an earlier commit, whole, into bin/magnet-COMMIT,
# for `magnet-lab bench --compare-with`: the bench runs that build's `magnet
# record` beside this one's, on the same transfers, and puts the two side
# by side in lab/results/RESULTS.md ("before and after"). A whole build, unlike
# lab/scripts/cost-before.sh (which grafts an earlier recording path onto today's
# tree, and so works only for commits whose packages still fit it): every
# build since d865c11 takes the `record` flags the bench passes (-q, --netns,
# -o, --ready-file).
#
#   lab/scripts/build-at.sh 98f58a4          # the recorder's first implementation
#   sudo lab/scripts/run.sh --compare-with bin/magnet-98f58a4 \
#        --compare-label "first implementation (98f58a4)" --label "main $(git rev-parse --short HEAD)"
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 1 ] || { echo "usage: lab/scripts/build-at.sh COMMIT" >&2; exit 2; }
commit=$(git rev-parse --verify --quiet --short "$1^{commit}") || { echo "lab/scripts/build-at.sh: no such commit: $1" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The generated BPF objects are committed, so the tree builds without clang.
git archive "$commit" | tar -x -C "$work"
export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
mkdir -p bin
(cd "$work" && go build -o "$OLDPWD/bin/magnet-$commit" ./cmd/magnet)
echo "bin/magnet-$commit"
