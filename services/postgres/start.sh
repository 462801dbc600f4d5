#!/usr/bin/env bash
# Start a throwaway PostgreSQL 15 cluster on 127.0.0.1 (fresh initdb on every start) with a database
# `toolledger` and passwordless (trust) access for user `postgres`, over loopback TCP only.
# fsync / synchronous_commit / full_page_writes stay ON: the ledger's durability is what we test.
#
# Usage: services/postgres/start.sh
#
# Environment:
#   TOOLLEDGER_PG_PORT           TCP port on 127.0.0.1 (default 15432)
#   TOOLLEDGER_PG_BIN            dir with initdb/pg_ctl (default /usr/lib/postgresql/15/bin)
#   TOOLLEDGER_PG_OS_USER        OS user that runs the server when invoked as root (default postgres)
#   TOOLLEDGER_PG_START_TIMEOUT  seconds to wait for readiness (default 60)
#
# State: <repo>/.services/postgres/{data,run,log} (see common.sh for the /tmp fallback)
# Stop:  services/postgres/stop.sh
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=services/postgres/common.sh
. "$HERE/common.sh"

case "${1:-}" in
  "") ;;
  -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
  *) pg_die "unknown argument: $1" ;;
esac

[[ "$PG_PORT" =~ ^[0-9]+$ ]] || pg_die "TOOLLEDGER_PG_PORT must be a number, got '$PG_PORT'"
TIMEOUT=${TOOLLEDGER_PG_START_TIMEOUT:-60}
[[ "$TIMEOUT" =~ ^[0-9]+$ ]] || pg_die "TOOLLEDGER_PG_START_TIMEOUT must be a number of seconds"
PGBIN=$(pg_find_bin) || pg_die "PostgreSQL server binaries not found (apt-get install postgresql-15, or set TOOLLEDGER_PG_BIN)"
PG_VERSION=$("$PGBIN/postgres" --version | sed 's/^[^0-9]*//')
T0=$SECONDS
DB=toolledger
PSQL=("$PGBIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U postgres)

ensure_db() {
  if [ -z "$("${PSQL[@]}" -d postgres -c "SELECT 1 FROM pg_database WHERE datname = '$DB'")" ]; then
    "${PSQL[@]}" -d postgres -c "CREATE DATABASE $DB"
    pg_log "created database $DB"
  fi
}

# --- already running? ------------------------------------------------------------------------------
if [ -f "$POINTER" ]; then
  OLD_BASE=$(cat "$POINTER")
  if [ -f "$OLD_BASE/data/postmaster.pid" ] && run_pg "$PGBIN/pg_ctl" status -D "$OLD_BASE/data" >/dev/null 2>&1; then
    OLD_PORT=$(sed -n 4p "$OLD_BASE/data/postmaster.pid")
    [ "$OLD_PORT" = "$PG_PORT" ] \
      || pg_die "a cluster from this repo is already running on port $OLD_PORT; run services/postgres/stop.sh first"
    pg_log "already running on 127.0.0.1:$PG_PORT (data ${OLD_BASE#"$ROOT"/}/data); nothing to do"
    ensure_db
    exit 0
  fi
fi
pg_port_open "$PG_PORT" && pg_die "127.0.0.1:$PG_PORT is already in use by another process (set TOOLLEDGER_PG_PORT)"

# --- where the cluster goes: the repo if PG_OS_USER can write there, else /tmp --------------------------
mkdir -p "$STATE"
BASE="$STATE"
rm -rf "$BASE/data" "$BASE/run" "$BASE/log"
mkdir -m 0700 "$BASE/data"
pg_own "$BASE/data"
if ! run_pg test -w "$BASE/data" 2>/dev/null; then
  rm -rf "$BASE/data"
  BASE="/tmp/toolledger-pg-$(printf '%s' "$ROOT" | sha256sum | cut -c1-12)"
  pg_log "user $PG_OS_USER cannot reach $STATE; using $BASE instead"
  rm -rf "$BASE"
  mkdir -m 0700 "$BASE"
  pg_own "$BASE"
  mkdir -m 0700 "$BASE/data"
  pg_own "$BASE/data"
fi
mkdir -m 0700 "$BASE/run" "$BASE/log"
pg_own "$BASE/run" "$BASE/log"
printf '%s\n' "$BASE" >"$POINTER"
DATA="$BASE/data"

# --- initdb + config --------------------------------------------------------------------------------
pg_log "initdb (PostgreSQL $PG_VERSION, OS user $PG_OS_USER) into ${DATA#"$ROOT"/}"
if ! run_pg "$PGBIN/initdb" -D "$DATA" -U postgres -E UTF8 --locale=C --auth=trust \
      >"$BASE/log/initdb.log" 2>&1; then
  cat "$BASE/log/initdb.log" >&2
  pg_die "initdb failed"
fi

cat >>"$DATA/postgresql.conf" <<EOF

# ---- toolledger services/postgres/start.sh ----
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$BASE/run'
unix_socket_permissions = 0700
# durability stays on: correctness of the ledger is what the tests exercise
fsync = on
synchronous_commit = on
full_page_writes = on
max_connections = 100
shared_buffers = 128MB
max_prepared_transactions = 0
logging_collector = off
log_min_messages = warning
log_line_prefix = '%m [%p] %q%u@%d '
EOF

# trust for the postgres role only, over the private socket dir and 127.0.0.1 only
cat >"$DATA/pg_hba.conf" <<'EOF'
# toolledger throwaway cluster (services/postgres/start.sh): no other roles, no other hosts
# TYPE  DATABASE  USER      ADDRESS        METHOD
local   all       postgres                 trust
host    all       postgres  127.0.0.1/32   trust
EOF

# --- start (own session, survives this shell) ------------------------------------------------------
pg_log "starting on 127.0.0.1:$PG_PORT (socket dir ${BASE#"$ROOT"/}/run, fsync on)"
if ! run_pg setsid "$PGBIN/pg_ctl" start -D "$DATA" -l "$BASE/log/postgres.log" -w -t "$TIMEOUT" -s; then
  tail -n 40 "$BASE/log/postgres.log" >&2 || true
  pg_die "pg_ctl start failed"
fi

DEADLINE=$((SECONDS + TIMEOUT))
until "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -t 2; do
  if [ "$SECONDS" -ge "$DEADLINE" ]; then
    tail -n 40 "$BASE/log/postgres.log" >&2 || true
    run_pg "$PGBIN/pg_ctl" stop -D "$DATA" -m immediate -s >/dev/null 2>&1 || true
    pg_die "not ready within $TIMEOUT s"
  fi
  pg_log "... waiting for pg_isready"
  sleep 0.5
done

ensure_db
FSYNC=$("${PSQL[@]}" -d "$DB" -c 'SHOW fsync')
pg_log "PostgreSQL $PG_VERSION ready on 127.0.0.1:$PG_PORT (database $DB, fsync=$FSYNC) after $((SECONDS - T0)) s; log: ${BASE#"$ROOT"/}/log/postgres.log"
