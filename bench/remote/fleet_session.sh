#!/usr/bin/env bash
# The queue's figures on a lent machine's CPUs (docs/queue.md#not-yet-measured: the rows
# that need cores to spare), each run under its own time limit so that a call to the device never outlives its
# 10 minutes, its JSON and printed figures in $OUT as each run (fleet: each row) ends.
#
# Here, first: the wheels the image lacks into .whl/ (ignored; bench/remote/gpu_session.sh says how), with
# the `postgres` extra and pgserver, whose PostgreSQL build the PostgreSQL rows run (the image has no
# server). Then one device call, with .whl carried; each argument is NAME LIMIT_S TOOL ARGS..., TOOL
# fleet (`make bench-fleet`) or calls (`make bench-calls`):
#   bash bench/remote/fleet_session.sh \
#     "pg 330 fleet --stores postgres,postgres-2 --shapes gpu,node --gpus 500 --seconds 30 --overload-gpus 0 --pin" \
#     "calls 150 calls --store postgres --durable"
set -u
OUT=${OUT:-var/fleet-session}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
# PostgreSQL refuses to run as root; bench.servers.Postgres runs it as `postgres`, which images lack.
if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then useradd -M postgres || exit 1; fi
LOG=$OUT/log.txt
echo "$(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(git rev-parse --short HEAD 2>/dev/null)" | tee -a "$LOG"
for run in "$@"; do
  read -r name limit tool args <<<"$run"
  case $tool in fleet|calls) ;; *) echo "$name: TOOL is fleet or calls, not '$tool'" | tee -a "$LOG"; continue;; esac
  echo "== $(date -u +%T) $name (limit ${limit}s): $tool $args" | tee -a "$LOG"
  # shellcheck disable=SC2086
  timeout -k 10 "$limit" python3 -m bench "$tool" $args --out "$OUT/$name.json" >> "$LOG" 2>&1
  rc=$?  # before the line below: its $(date) would reset $? (124: the limit cut the run short)
  echo "== $(date -u +%T) $name exit $rc" | tee -a "$LOG"
done
