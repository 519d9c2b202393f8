#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The long soak of rotation (CI runs a 20 s version of the same test):
# continuous recording of steady traffic between two namespaces, a new file
# every MAGNET_SOAK_ROTATE, for MAGNET_SOAK; it fails unless every seam is
# exact (the chain holds exactly what the recorder counted, type by type,
# each file starting at the record and time the previous ended) and the
# recorder's heap stays flat. Needs root.
#   sudo scripts/soak.sh                 # 2 hours, a file every 10 minutes
#   sudo MAGNET_SOAK=30m MAGNET_SOAK_ROTATE=1m scripts/soak.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export MAGNET_SOAK="${MAGNET_SOAK:-2h}"
export MAGNET_SOAK_ROTATE="${MAGNET_SOAK_ROTATE:-10m}"
exec go test -count=1 -v -run '^TestRotationSoak$' -timeout 0 ./internal/record
