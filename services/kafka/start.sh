#!/usr/bin/env bash
# Start a throwaway single-node KRaft Kafka broker on 127.0.0.1, built from Maven Central jars
# (no Docker, no tarball). Every start formats a fresh, empty log dir.
#
# Usage: services/kafka/start.sh [--version 3|4]        (default 3 = Kafka 3.9.x; 4 = Kafka 4.x)
#
# Environment:
#   TOOLLEDGER_KAFKA_MAJOR            3 or 4 when --version is not given (KAFKA_MAJOR is accepted too)
#   TOOLLEDGER_KAFKA_PORT             client port (default 19092)
#   TOOLLEDGER_KAFKA_CONTROLLER_PORT  KRaft controller port (default: client port + 1, i.e. 19093)
#   TOOLLEDGER_KAFKA_VERSION          exact version override, e.g. 4.0.1 (default: pinned in pom.xml)
#   TOOLLEDGER_KAFKA_HEAP             JVM max heap (default 512m)
#   TOOLLEDGER_KAFKA_START_TIMEOUT    seconds to wait for readiness (default 120)
#   JAVA_HOME                         Java to use (default: java on PATH; Kafka 4.x needs Java 17+)
#
# Jars:  <repo>/.cache/kafka-<version>/libs   (Maven runs only when this cache is missing)
# State: <repo>/.services/kafka/<port>/       (server.properties, data/, logs/kafka.out, kafka.pid)
# Stop:  services/kafka/stop.sh
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)

log() { printf '[kafka] %s\n' "$*"; }
die() { printf '[kafka] ERROR: %s\n' "$*" >&2; exit 1; }
# shellcheck source=services/kafka/common.sh
. "$HERE/common.sh"

REQUESTED=${TOOLLEDGER_KAFKA_MAJOR:-${KAFKA_MAJOR:-}}
while [ $# -gt 0 ]; do
  case "$1" in
    --version) [ $# -ge 2 ] || die "--version needs 3 or 4"; REQUESTED=$2; shift 2 ;;
    --version=*) REQUESTED=${1#*=}; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) die "unknown argument: $1 (usage: start.sh [--version 3|4])" ;;
  esac
done
kafka_version "$REQUESTED"

PORT=${TOOLLEDGER_KAFKA_PORT:-19092}
[[ "$PORT" =~ ^[0-9]+$ ]] || die "TOOLLEDGER_KAFKA_PORT must be a number, got '$PORT'"
CPORT=${TOOLLEDGER_KAFKA_CONTROLLER_PORT:-$((PORT + 1))}
[[ "$CPORT" =~ ^[0-9]+$ ]] || die "TOOLLEDGER_KAFKA_CONTROLLER_PORT must be a number, got '$CPORT'"
[ "$PORT" != "$CPORT" ] || die "client and controller port are both $PORT"
TIMEOUT=${TOOLLEDGER_KAFKA_START_TIMEOUT:-120}
[[ "$TIMEOUT" =~ ^[0-9]+$ ]] || die "TOOLLEDGER_KAFKA_START_TIMEOUT must be a number of seconds"
T0=$SECONDS

kafka_java

# --- already running? ------------------------------------------------------------------------------
WORK="$ROOT/.services/kafka/$PORT"
if [ -f "$WORK/kafka.pid" ]; then
  OLD_PID=$(cat "$WORK/kafka.pid" 2>/dev/null || true)
  if is_our_broker "$OLD_PID"; then
    RUNNING=$(cat "$WORK/version" 2>/dev/null || echo "?")
    if [ "$RUNNING" = "$VERSION" ] && port_open "$PORT"; then
      log "Kafka $VERSION already running on 127.0.0.1:$PORT (pid $OLD_PID); nothing to do"
      exit 0
    fi
    die "a broker (Kafka $RUNNING, pid $OLD_PID) is already running for port $PORT; run services/kafka/stop.sh first"
  fi
fi
for p in "$PORT" "$CPORT"; do
  port_open "$p" && die "127.0.0.1:$p is already in use by another process (set TOOLLEDGER_KAFKA_PORT / TOOLLEDGER_KAFKA_CONTROLLER_PORT)"
done

kafka_libs

# --- fresh work dir + config -----------------------------------------------------------------------
rm -rf "$WORK"
mkdir -p "$WORK/data" "$WORK/logs"
kafka_render "$HERE/server.properties.in" "$WORK/server.properties" \
  "PORT=$PORT" "CPORT=$CPORT" "DATA_DIR=$WORK/data"

CID=$(kafka_cluster_id)
log "formatting KRaft storage (cluster id $CID) in ${WORK#"$ROOT"/}"
kafka_format "$WORK" "$CID"

# --- start (own session, survives this shell) ------------------------------------------------------
log "starting Kafka $VERSION on 127.0.0.1:$PORT (controller 127.0.0.1:$CPORT, heap $HEAP)"
kafka_launch "$WORK" "kafka-$PORT"
printf '%s\n' "$VERSION" >"$WORK/version"

PID=""
fail() {
  log "ERROR: $*" >&2
  echo "----- last lines of ${WORK#"$ROOT"/}/logs/kafka.out -----" >&2
  tail -n 60 "$WORK/logs/kafka.out" >&2 || true
  bash "$HERE/stop.sh" >&2 || true
  exit 1
}
trap 'fail "interrupted"' INT TERM

DEADLINE=$((SECONDS + TIMEOUT)); NEXT_NOTE=$((SECONDS + 10))
while :; do
  [ -n "$PID" ] || PID=$(cat "$WORK/kafka.pid" 2>/dev/null || true)
  if [ -n "$PID" ] && grep -q "Kafka Server started" "$WORK/logs/kafka.out" 2>/dev/null && port_open "$PORT"; then
    break
  fi
  if [ -n "$PID" ] && ! kill -0 "$PID" 2>/dev/null; then fail "Kafka exited during startup"; fi
  [ "$SECONDS" -lt "$DEADLINE" ] || fail "Kafka was not ready within $TIMEOUT s"
  if [ "$SECONDS" -ge "$NEXT_NOTE" ]; then
    log "... waiting for the broker ($((SECONDS - T0)) s)"; NEXT_NOTE=$((SECONDS + 10))
  fi
  sleep 0.5
done
trap - INT TERM
log "Kafka $VERSION ready on 127.0.0.1:$PORT (pid $PID) after $((SECONDS - T0)) s; log: ${WORK#"$ROOT"/}/logs/kafka.out"
