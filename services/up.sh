#!/usr/bin/env bash
# Start the local services toolledger needs: a single-node Kafka (KRaft) broker and PostgreSQL 15,
# both on 127.0.0.1. If either fails, whatever was started is stopped again and the exit code is 1.
#
# Usage: services/up.sh [--version 3|4]      (Kafka major version, passed to services/kafka/start.sh)
# Then:  . services/env.sh                    (exports TOOLLEDGER_KAFKA and TOOLLEDGER_POSTGRES)
# Ports: TOOLLEDGER_KAFKA_PORT (19092; controller +1), TOOLLEDGER_PG_PORT (15432)
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

T0=$SECONDS
bash "$HERE/chromium/install.sh" || echo "[up] Chromium is not installed: tests/browser will fail" >&2
if ! bash "$HERE/kafka/start.sh" "$@"; then
  echo "[up] Kafka failed to start; stopping what was started" >&2
  bash "$HERE/kafka/stop.sh" || true
  exit 1
fi
if ! bash "$HERE/postgres/start.sh"; then
  echo "[up] PostgreSQL failed to start; stopping what was started" >&2
  bash "$HERE/postgres/stop.sh" || true
  bash "$HERE/kafka/stop.sh" || true
  exit 1
fi

# print what was started here, not values inherited from the caller
unset TOOLLEDGER_KAFKA TOOLLEDGER_POSTGRES
# shellcheck source=services/env.sh
. "$HERE/env.sh"
echo "[up] services ready in $((SECONDS - T0)) s:"
echo "[up]   TOOLLEDGER_KAFKA=$TOOLLEDGER_KAFKA"
echo "[up]   TOOLLEDGER_POSTGRES=$TOOLLEDGER_POSTGRES"
echo "[up] run '. services/env.sh' to export them; 'bash services/down.sh' to stop"
