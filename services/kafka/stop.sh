#!/usr/bin/env bash
# Stop the broker started by services/kafka/start.sh: SIGTERM (clean shutdown), then SIGKILL after
# TOOLLEDGER_KAFKA_STOP_TIMEOUT seconds (default 30). Safe to run when nothing is running.
#
# Usage: services/kafka/stop.sh [--all]
#   default  the broker for TOOLLEDGER_KAFKA_PORT (default 19092)
#   --all    every broker started from this repository (all of .services/kafka/*)
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
STATE="$ROOT/.services/kafka"
TIMEOUT=${TOOLLEDGER_KAFKA_STOP_TIMEOUT:-30}

log() { printf '[kafka] %s\n' "$*"; }
is_our_broker() {  # only signal a live process that start.sh launched (pid files can go stale)
  [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null \
    && tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -q -- '-Dtoolledger.service=kafka'
}

stop_one() {  # work dir
  local work=$1 pid i
  [ -f "$work/kafka.pid" ] || return 0
  pid=$(cat "$work/kafka.pid" 2>/dev/null || true)
  if ! is_our_broker "$pid"; then
    rm -f "$work/kafka.pid"
    return 0
  fi
  log "stopping Kafka on port ${work##*/} (pid $pid) ..."
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < TIMEOUT * 2; i++)); do
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$work/kafka.pid"; log "stopped (pid $pid)"; return 0
    fi
    sleep 0.5
  done
  log "still running after ${TIMEOUT} s: sending SIGKILL to pid $pid"
  kill -KILL "$pid" 2>/dev/null || true
  for ((i = 0; i < 20; i++)); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$work/kafka.pid"; log "killed (pid $pid)"; return 0; }
    sleep 0.25
  done
  log "ERROR: pid $pid survived SIGKILL" >&2
  return 1
}

case "${1:-}" in
  --all)
    rc=0
    for work in "$STATE"/*/; do
      [ -d "$work" ] || continue
      stop_one "${work%/}" || rc=1
    done
    exit "$rc" ;;
  "")
    stop_one "$STATE/${TOOLLEDGER_KAFKA_PORT:-19092}" ;;
  -h|--help)
    sed -n '2,7p' "$0" ;;
  *)
    printf '[kafka] unknown argument: %s (usage: stop.sh [--all])\n' "$1" >&2; exit 2 ;;
esac
