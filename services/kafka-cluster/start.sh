#!/usr/bin/env bash
# Start a throwaway three-node KRaft Kafka cluster on 127.0.0.1 (each node a combined broker and
# controller; replication factor 3, min.insync.replicas 2, the offsets and transaction state logs
# replicated the same way), from the same Maven Central jars as services/kafka/start.sh. Every start
# formats fresh, empty log dirs. Prints the bootstrap servers on its last line.
#
# Usage: services/kafka-cluster/start.sh [--version 3|4]     (default 3 = Kafka 3.9.x; 4 = Kafka 4.x)
#
# Environment:
#   TOOLLEDGER_KAFKA_CLUSTER_PORT     first port (default 19100): clients on +0..+2, controllers +3..+5
#   TOOLLEDGER_KAFKA_MAJOR            3 or 4 when --version is not given (KAFKA_MAJOR is accepted too)
#   TOOLLEDGER_KAFKA_VERSION          exact version override (default: pinned in services/kafka/pom.xml)
#   TOOLLEDGER_KAFKA_HEAP             JVM max heap of each node (default 512m)
#   TOOLLEDGER_KAFKA_START_TIMEOUT    seconds to wait for the three nodes (default 180)
#
# One node: services/kafka-cluster/node.sh kill|stop|start|restart N.  Stop: services/kafka-cluster/stop.sh
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
log() { printf '[kafka-cluster] %s\n' "$*"; }
die() { printf '[kafka-cluster] ERROR: %s\n' "$*" >&2; exit 1; }
# shellcheck source=services/kafka-cluster/common.sh
. "$HERE/common.sh"

REQUESTED=${TOOLLEDGER_KAFKA_MAJOR:-${KAFKA_MAJOR:-}}
while [ $# -gt 0 ]; do
  case "$1" in
    --version) [ $# -ge 2 ] || die "--version needs 3 or 4"; REQUESTED=$2; shift 2 ;;
    --version=*) REQUESTED=${1#*=}; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) die "unknown argument: $1 (usage: start.sh [--version 3|4])" ;;
  esac
done
kafka_version "$REQUESTED"
kafka_java
T0=$SECONDS

DOWN=()
for n in "${NODES[@]}"; do node_pid "$n" >/dev/null || DOWN+=("$n"); done
if [ "${#DOWN[@]}" -lt "${#NODES[@]}" ]; then
  RUNNING=$(cat "$CLUSTER/version" 2>/dev/null || echo "?")
  [ "$RUNNING" = "$VERSION" ] \
    || die "a Kafka $RUNNING cluster runs on ports from $BASE; run services/kafka-cluster/stop.sh first"
  for n in "${DOWN[@]}"; do bash "$HERE/node.sh" start "$n"; done  # left down by a test
  log "Kafka $VERSION cluster already running"
  bootstrap
  exit 0
fi
for n in "${NODES[@]}"; do
  for p in "$(node_port "$n")" "$(node_cport "$n")"; do
    port_open "$p" && die "127.0.0.1:$p is already in use by another process (set TOOLLEDGER_KAFKA_CLUSTER_PORT)"
  done
done

kafka_libs

rm -rf "$CLUSTER"
VOTERS=""
for n in "${NODES[@]}"; do VOTERS+="${VOTERS:+,}$n@127.0.0.1:$(node_cport "$n")"; done
CID=$(kafka_cluster_id)
log "formatting three nodes (cluster id $CID) in ${CLUSTER#"$ROOT"/}"
for n in "${NODES[@]}"; do
  WORK=$(node_work "$n")
  mkdir -p "$WORK/data" "$WORK/logs"
  kafka_render "$HERE/server.properties.in" "$WORK/server.properties" "NODE_ID=$n" \
    "PORT=$(node_port "$n")" "CPORT=$(node_cport "$n")" "VOTERS=$VOTERS" "DATA_DIR=$WORK/data"
  kafka_format "$WORK" "$CID"
done
printf '%s\n' "$VERSION" >"$CLUSTER/version"
bootstrap >"$CLUSTER/bootstrap"

trap 'bash "$HERE/stop.sh" >&2; exit 1' INT TERM
log "starting Kafka $VERSION on $(bootstrap) (heap $HEAP each)"
for n in "${NODES[@]}"; do launch_node "$n"; done
DEADLINE=$((SECONDS + START_TIMEOUT))
for n in "${NODES[@]}"; do
  wait_started "$n" 0 "$DEADLINE" || { bash "$HERE/stop.sh" >&2; die "the cluster did not start"; }
done
trap - INT TERM
log "Kafka $VERSION cluster ready after $((SECONDS - T0)) s; logs: ${CLUSTER#"$ROOT"/}/node-*/logs/kafka.out"
bootstrap
