# shellcheck shell=bash
# Shared by services/postgres/start.sh and stop.sh (sourced; needs HERE and ROOT set).
#
# Layout: the cluster lives in <repo>/.services/postgres/{data,run,log} when the OS user that runs
# PostgreSQL can write there. When the repo is not reachable for that user (e.g. a repo under a
# 0700 home directory while we run as root), it falls back to /tmp/toolledger-pg-<hash of repo path>.
# start.sh records the chosen base in <repo>/.services/postgres/cluster-dir for stop.sh.

STATE="$ROOT/.services/postgres"
# shellcheck disable=SC2034  # POINTER and PG_PORT are used by the scripts that source this file
POINTER="$STATE/cluster-dir"
# shellcheck disable=SC2034
PG_PORT=${TOOLLEDGER_PG_PORT:-15432}

pg_log() { printf '[postgres] %s\n' "$*"; }
pg_die() { printf '[postgres] ERROR: %s\n' "$*" >&2; exit 1; }

# PostgreSQL server binaries: TOOLLEDGER_PG_BIN, else Debian's PostgreSQL 15, else pg_config on PATH.
pg_find_bin() {
  local d
  for d in "${TOOLLEDGER_PG_BIN:-}" /usr/lib/postgresql/15/bin; do
    if [ -n "$d" ] && [ -x "$d/pg_ctl" ] && [ -x "$d/initdb" ]; then printf '%s\n' "$d"; return 0; fi
  done
  if command -v pg_config >/dev/null 2>&1; then
    d=$(pg_config --bindir)
    if [ -x "$d/pg_ctl" ] && [ -x "$d/initdb" ]; then printf '%s\n' "$d"; return 0; fi
  fi
  return 1
}

# PostgreSQL refuses to run as root: as root, run the server tools as TOOLLEDGER_PG_OS_USER (postgres).
if [ "$(id -u)" -eq 0 ]; then
  PG_OS_USER=${TOOLLEDGER_PG_OS_USER:-postgres}
  id "$PG_OS_USER" >/dev/null 2>&1 \
    || pg_die "running as root, but OS user '$PG_OS_USER' does not exist (apt-get install postgresql-15 creates it)"
  run_pg() { (cd / && runuser -u "$PG_OS_USER" -- "$@"); }
  pg_own() { chown "$PG_OS_USER:" "$@"; }
else
  PG_OS_USER=$(id -un)
  run_pg() { (cd / && "$@"); }
  pg_own() { :; }
fi

pg_port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
