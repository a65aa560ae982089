#!/usr/bin/env bash
# Start one worker node: one rank per GPU under torchrun, restarted as a group when a rank fails.
# Scale out by running this on more nodes pointed at the same scheduler; nodes share nothing.
#
#   CONFIG=configs/flux-schnell.toml NPROC=8 launch/node.sh [--set queue.url=http://queue:8700 ...]
#
# One group across nodes (c10d rendezvous; run the same line on each node):
#
#   NNODES=2 RDZV_ENDPOINT=node-a:29400 RDZV_ID=flux-1 NPROC=8 launch/node.sh --set queue.url=...
#
# `launch/node.sh --dry-run [args]` prints the exact torchrun command (and OMP_NUM_THREADS) and exits.
#
# SIGTERM, SIGINT (Ctrl-C) or SIGHUP drains: no new leases, the tasks held finish and are reported,
# then every rank exits 0 and so does this script, also when the signal comes while torchrun
# restarts the group. A second signal, or a drain longer than DRAIN_S seconds (default 300), stops
# at once; the scheduler retries what was held.
#
# A start error no restart can cure (a config typo or wrong type, a device the machine lacks, the ops
# port taken, a token the scheduler refuses) ends this script with exit code 2 (3 for the token),
# once: `dit-worker check` finds most before torchrun starts, and a rank that finds one later
# records it so that torchrun stops after one restart (worker/nodedir.py).
#
# Environment: CONFIG, NPROC (default: the GPUs nvidia-smi lists, else 1), MAX_RESTARTS,
# OMP_NUM_THREADS (default: the cores this process may use, shared among the ranks), NNODES
# (default 1), RDZV_ENDPOINT (host:port, needed when NNODES > 1), RDZV_ID (default dit-worker).
set -euo pipefail

DRY_RUN=0
if [ "${1:-}" = "--dry-run" ]; then DRY_RUN=1; shift; fi

CONFIG=${CONFIG:-configs/flux-schnell.toml}
NPROC=${NPROC:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)}
[ "${NPROC:-0}" -ge 1 ] || NPROC=1
MAX_RESTARTS=${MAX_RESTARTS:-1000}   # a crashed rank restarts the group; its tasks are requeued
DRAIN_S=${DRAIN_S:-300}              # a supervisor's stop timeout must outlast it (plus torchrun's 30 s)
if ! [[ "$DRAIN_S" =~ ^[0-9]+$ ]]; then
  echo "node.sh: DRAIN_S=$DRAIN_S is not a number of seconds" >&2
  exit 2
fi

# CPU threads per rank. Kernels round differently with the thread count, so this is also what makes
# images identical across rank counts on a CPU; torchrun alone would set 1 and warn.
if [ -z "${OMP_NUM_THREADS:-}" ]; then
  OMP_NUM_THREADS=$(( $(nproc) / NPROC ))
  [ "$OMP_NUM_THREADS" -ge 1 ] || OMP_NUM_THREADS=1
fi
export OMP_NUM_THREADS

NNODES=${NNODES:-1}
if ! [[ "$NNODES" =~ ^[1-9][0-9]*$ ]]; then
  echo "node.sh: NNODES=$NNODES is not a number of nodes (1, 2, ...)" >&2
  exit 2
elif [ "$NNODES" -eq 1 ]; then
  GROUP=(--standalone)
elif [ -n "${RDZV_ENDPOINT:-}" ]; then
  # Every node runs this line; the rendezvous ranks them. The run id names the group (the node id
  # the scheduler sees), so it must differ between groups sharing an endpoint.
  GROUP=(--nnodes="$NNODES" --rdzv_backend=c10d --rdzv_endpoint="$RDZV_ENDPOINT" --rdzv_id="${RDZV_ID:-dit-worker}")
else
  echo "node.sh: NNODES=$NNODES needs RDZV_ENDPOINT=host:port (the rendezvous, e.g. the first node:29400)" >&2
  exit 2
fi
CMD=(torchrun "${GROUP[@]}" --nproc_per_node="$NPROC" --max-restarts="$MAX_RESTARTS"
     -m worker --config "$CONFIG" "$@")

if [ "$DRY_RUN" -eq 1 ]; then
  printf 'OMP_NUM_THREADS=%s' "$OMP_NUM_THREADS"
  printf ' %q' "${CMD[@]}"
  printf '\n'
  exit 0
fi

# Start errors that no restart can cure, before any rank starts: exit 2 with the field to fix.
dit-worker check --config "$CONFIG" "$@" || exit $?

NODE_DIR=$(mktemp -d -t dit-node.XXXXXX)
# torchrun in a session of its own: a Ctrl-C at the terminal reaches this script alone, which
# drains the ranks, instead of torchrun, which would kill them after 30 s and exit 1.
# TORCH_ELASTIC_SHUTDOWN_TIMEOUT: when torchrun itself is signalled (a `kill` of its pid, SLURM
# signalling every process of the step), the ranks still get DRAIN_S to drain.
TORCH_ELASTIC_SHUTDOWN_TIMEOUT=$DRAIN_S setsid "${CMD[@]}" --node-dir "$NODE_DIR" &
TORCHRUN=$!

# A signal to torchrun itself makes it exit 1 with a traceback, so a clean drain would look like a
# failure. The ranks are told directly instead: rank 0 drains and shuts the group down, every rank
# exits 0, and torchrun exits 0 with them. The stop file tells a group that torchrun starts later.
signals=0
TIMER=
on_signal() {
  signals=$((signals + 1))
  if [ "$signals" -eq 1 ]; then
    echo "node.sh: draining for at most ${DRAIN_S}s (signal again to stop at once)" >&2
    : > "$NODE_DIR/stop"   # before the signal: a rank that misses the signal sees the file
    pkill -TERM -P "$TORCHRUN" || true
    ( sleep "$DRAIN_S" && kill -USR1 $$ ) 2>/dev/null &
    TIMER=$!
  else
    echo "node.sh: stopping now" >&2
    stop_now
  fi
}
drain_overdue() {
  echo "node.sh: the drain took over DRAIN_S=${DRAIN_S}s; stopping now (the scheduler retries what was held)" >&2
  signals=$((signals + 1))
  stop_now
}
stop_now() {
  # torchrun first, so that it shuts down instead of restarting the group; then the ranks, which
  # torchrun would otherwise give DRAIN_S more. The ranks are named before torchrun is signalled: once
  # it has exited they are no longer its children, and a rank stuck in its drain would live on.
  local ranks
  ranks=$(pgrep -P "$TORCHRUN" 2>/dev/null || true)
  kill -TERM "$TORCHRUN" 2>/dev/null || true
  [ -z "$ranks" ] || kill -KILL $ranks 2>/dev/null || true
}
trap on_signal TERM INT HUP
trap drain_overdue USR1
cleanup() {
  if [ -n "$TIMER" ]; then
    pkill -P "$TIMER" 2>/dev/null || true   # its sleep
    kill "$TIMER" 2>/dev/null || true
  fi
  rm -rf "$NODE_DIR"
}
trap cleanup EXIT

while :; do
  seen=$signals
  rc=0
  wait "$TORCHRUN" || rc=$?
  [ "$signals" -ne "$seen" ] || break           # torchrun ended
  kill -0 "$TORCHRUN" 2>/dev/null && continue   # a signal interrupted the wait
  late=0; wait "$TORCHRUN" 2>/dev/null || late=$?  # ended as the signal came: its own status
  [ "$late" -eq 127 ] || rc=$late
  break
done

if [ -s "$NODE_DIR/fatal" ]; then
  { read -r code; read -r message; } < "$NODE_DIR/fatal"
  echo "node.sh: not restarting: $message" >&2
  exit "$code"
fi
if [ "$rc" -ne 0 ] && [ -e "$NODE_DIR/drained" ]; then
  echo "node.sh: the ranks drained cleanly (torchrun exited $rc because it was signalled itself)" >&2
  rc=0
fi
exit "$rc"
