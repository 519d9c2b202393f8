#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# go test -exec helper: runs a test binary as nobody (uid and gid 65534, no
# groups), so that root can check what an unprivileged user's `go test`
# does: the root tests skip, every other test must pass. Go builds the
# binary in a directory only root can enter, so it is copied out first.
# MAGNET_UNPRIV_DIR: a directory nobody owns, for the copies and for HOME,
# GOCACHE and GOMODCACHE of tests that run the go command (fill its gomod
# first: scripts/test.sh does). CI is unset: the root run before this one
# already required every tool, and tools root installed under its own home
# (python's pyarrow and duckdb under pyenv) are out of nobody's reach, so a
# test that needs one skips here rather than fail.
set -euo pipefail
dir=${MAGNET_UNPRIV_DIR:?MAGNET_UNPRIV_DIR is not set}
bin=$1
shift
copy=$(mktemp "$dir/test.XXXXXX")
cp "$bin" "$copy"
chmod 755 "$copy"
trap 'rm -f "$copy"' EXIT
setpriv --reuid=65534 --regid=65534 --clear-groups \
	env -u CI HOME="$dir" TMPDIR="$dir" GOCACHE="$dir/gocache" GOMODCACHE="$dir/gomod" \
	GOPROXY=off GOFLAGS="-modcacherw -buildvcs=false" "$copy" "$@"
