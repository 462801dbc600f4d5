#!/usr/bin/env bash
# Stop the cluster started by services/postgres/start.sh (pg_ctl stop -m fast; -m immediate if that
# does not finish in time). Safe to run when nothing is running. The data dir is kept for inspection
# and wiped by the next start.
#
# Usage: services/postgres/stop.sh
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=services/postgres/common.sh
. "$HERE/common.sh"

[ -f "$POINTER" ] || exit 0
DATA="$(cat "$POINTER")/data"
[ -f "$DATA/postmaster.pid" ] || exit 0
PGBIN=$(pg_find_bin) || { pg_log "ERROR: PostgreSQL binaries not found; cannot stop $DATA" >&2; exit 1; }

if ! run_pg "$PGBIN/pg_ctl" status -D "$DATA" >/dev/null 2>&1; then
  exit 0
fi
pg_log "stopping (pg_ctl stop -m fast, data ${DATA#"$ROOT"/}) ..."
if run_pg "$PGBIN/pg_ctl" stop -D "$DATA" -m fast -w -t "${TOOLLEDGER_PG_STOP_TIMEOUT:-60}" -s; then
  pg_log "stopped"
  exit 0
fi
pg_log "fast shutdown did not finish; trying -m immediate" >&2
run_pg "$PGBIN/pg_ctl" stop -D "$DATA" -m immediate -w -t 30 -s && { pg_log "stopped (immediate)"; exit 0; }
pg_log "ERROR: could not stop the cluster in $DATA" >&2
exit 1
