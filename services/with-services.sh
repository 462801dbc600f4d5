#!/usr/bin/env bash
# Run a command against freshly started local services, then stop them -- also when the command
# fails or is interrupted. Exits with the command's status (1 if the services did not start).
#
# Usage: services/with-services.sh CMD [ARGS...]        e.g. services/with-services.sh pytest -q
#
# Kafka major version: TOOLLEDGER_KAFKA_MAJOR (or KAFKA_MAJOR) = 3 (default) or 4.
# Ports: TOOLLEDGER_KAFKA_PORT (19092), TOOLLEDGER_KAFKA_CONTROLLER_PORT (port+1), TOOLLEDGER_PG_PORT (15432).
# CMD sees TOOLLEDGER_KAFKA / TOOLLEDGER_POSTGRES pointing at these services.
# If both services were already running before (e.g. `make services-up`), they are left running.
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

KEEP=0
if kafka_running && postgres_running; then
  KEEP=1
  echo "[with-services] services already running; they will be left running"
fi
if [ "$KEEP" = 0 ]; then
  trap 'bash "$HERE/down.sh"' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
fi
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
