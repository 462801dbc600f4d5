#!/usr/bin/env bash
# Run a command against freshly started local services, then stop them -- also when the command
# fails or is interrupted. Exits with the command's status (1 if the services did not start).
#
# Usage: services/with-services.sh CMD [ARGS...]        e.g. services/with-services.sh pytest -q
#
# Kafka major version: TOOLLEDGER_KAFKA_MAJOR (or KAFKA_MAJOR) = 3 (default) or 4.
# Ports: TOOLLEDGER_KAFKA_PORT (19092), TOOLLEDGER_KAFKA_CONTROLLER_PORT (port+1), TOOLLEDGER_PG_PORT (15432),
# TOOLLEDGER_KAFKA_CLUSTER_PORT (19100: the three-node cluster that tests/faults starts and stops itself).
# CMD sees TOOLLEDGER_KAFKA / TOOLLEDGER_POSTGRES pointing at these services.
# A service that was already running before (e.g. `make services-up`) is used and left running.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
[ $# -gt 0 ] || { echo "usage: services/with-services.sh CMD [ARGS...]" >&2; exit 2; }

kafka_running() {
  local pid
  pid=$(cat "$ROOT/.services/kafka/${TOOLLEDGER_KAFKA_PORT:-19092}/kafka.pid" 2>/dev/null) && kill -0 "$pid" 2>/dev/null
}
postgres_running() {
  local base pid
  base=$(cat "$ROOT/.services/postgres/cluster-dir" 2>/dev/null) \
    && pid=$(head -n 1 "$base/data/postmaster.pid" 2>/dev/null) && kill -0 "$pid" 2>/dev/null
}

cluster_running() {  # the three-node cluster the replicated fault tests start (tests/faults)
  local pid
  for pid in "$ROOT/.services/kafka-cluster/${TOOLLEDGER_KAFKA_CLUSTER_PORT:-19100}"/node-*/kafka.pid; do
    pid=$(cat "$pid" 2>/dev/null) && kill -0 "$pid" 2>/dev/null && return 0
  done
  return 1
}

# stop afterwards only what this run starts (the tests stop the cluster they start; this stops
# it too if pytest died before it could)
STOP_KAFKA=1; STOP_PG=1; STOP_CLUSTER=1
kafka_running && { STOP_KAFKA=0; echo "[with-services] Kafka already running on port ${TOOLLEDGER_KAFKA_PORT:-19092}; leaving it running"; }
postgres_running && { STOP_PG=0; echo "[with-services] PostgreSQL already running; leaving it running"; }
cluster_running && { STOP_CLUSTER=0; echo "[with-services] the Kafka cluster already runs; leaving it running"; }
# shellcheck disable=SC2317  # invoked through the EXIT trap
cleanup() {
  if [ "$STOP_CLUSTER" = 1 ]; then bash "$HERE/kafka-cluster/stop.sh" || true; fi
  if [ "$STOP_KAFKA" = 1 ]; then bash "$HERE/kafka/stop.sh" || true; fi
  if [ "$STOP_PG" = 1 ]; then bash "$HERE/postgres/stop.sh" || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
bash "$HERE/up.sh" || exit 1

# the command must talk to the services started here, not to values inherited from the caller
unset TOOLLEDGER_KAFKA TOOLLEDGER_POSTGRES
# shellcheck source=services/env.sh
. "$HERE/env.sh"
echo "[with-services] running: $*"
"$@"
RC=$?
echo "[with-services] command exited with status $RC"
exit "$RC"
