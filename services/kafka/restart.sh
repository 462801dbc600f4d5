#!/usr/bin/env bash
# Restart the broker on TOOLLEDGER_KAFKA_PORT *keeping its data* (no re-format): stop it with
# SIGTERM (controlled shutdown), start the same command line again, wait until it serves.
# Used by the broker-restart fault test.
#
# Usage: services/kafka/restart.sh [down-seconds=0]
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PORT=${TOOLLEDGER_KAFKA_PORT:-19092}
WORK="$ROOT/.services/kafka/$PORT"
DOWN=${1:-0}
log() { printf '[kafka-restart] %s\n' "$*"; }
die() { printf '[kafka-restart] ERROR: %s\n' "$*" >&2; exit 1; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

PID=$(cat "$WORK/kafka.pid" 2>/dev/null) || die "no broker pid file in $WORK"
kill -0 "$PID" 2>/dev/null || die "broker pid $PID is not running"
mapfile -d '' ARGV <"/proc/$PID/cmdline"
[ "${#ARGV[@]}" -gt 2 ] || die "cannot read the broker's command line"

log "stopping broker pid $PID on port $PORT"
kill -TERM "$PID"
for _ in $(seq 1 120); do kill -0 "$PID" 2>/dev/null || break; sleep 0.5; done
kill -0 "$PID" 2>/dev/null && { kill -KILL "$PID"; sleep 1; }
sleep "$DOWN"

STARTED_BEFORE=$(grep -c "Kafka Server started" "$WORK/logs/kafka.out" || true)
# shellcheck disable=SC2016  # $$ and $@ are for the inner bash
setsid bash -c 'echo $$ >"$0"; exec "$@"' "$WORK/kafka.pid" "${ARGV[@]}" \
  </dev/null >>"$WORK/logs/kafka.out" 2>&1 &
for _ in $(seq 1 240); do
  NOW=$(grep -c "Kafka Server started" "$WORK/logs/kafka.out" || true)
  if [ "$NOW" -gt "$STARTED_BEFORE" ] && port_open "$PORT"; then
    log "broker back on 127.0.0.1:$PORT (pid $(cat "$WORK/kafka.pid"))"; exit 0
  fi
  sleep 0.5
done
die "the broker did not come back within 120 s"
