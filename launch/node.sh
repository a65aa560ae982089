#!/usr/bin/env bash
# Start one worker node: one rank per GPU under torchrun, restarted as a group when a rank fails.
# Scale out by running this on more nodes pointed at the same scheduler; nodes share nothing.
#
#   CONFIG=configs/flux-schnell.toml NPROC=8 launch/node.sh [--set queue.url=http://queue:8700 ...]
set -euo pipefail

CONFIG=${CONFIG:-configs/flux-schnell.toml}
NPROC=${NPROC:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)}
[ "${NPROC:-0}" -ge 1 ] || NPROC=1
MAX_RESTARTS=${MAX_RESTARTS:-1000}   # a crashed rank restarts the group; leases requeue its task

exec torchrun --standalone --nproc_per_node="$NPROC" --max-restarts="$MAX_RESTARTS" \
  -m worker --config "$CONFIG" "$@"
