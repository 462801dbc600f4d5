#!/usr/bin/env bash
# Stop what services/up.sh started: the Kafka broker for TOOLLEDGER_KAFKA_PORT (default 19092) and
# the PostgreSQL cluster; and the three-node Kafka cluster of TOOLLEDGER_KAFKA_CLUSTER_PORT (default
# 19100) if the replicated fault tests left it running. Always exits 0; safe to run when nothing is running.
#
# Usage: services/down.sh [--all]     --all: every Kafka broker started from this repo (any port)
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
KAFKA_ARGS=()
case "${1:-}" in
  "") ;;
  --all) KAFKA_ARGS=(--all) ;;
  *) echo "[down] unknown argument: $1 (usage: down.sh [--all])" >&2 ;;
esac
bash "$HERE/kafka/stop.sh" "${KAFKA_ARGS[@]}" || echo "[down] WARNING: Kafka stop reported a problem" >&2
bash "$HERE/kafka-cluster/stop.sh" || echo "[down] WARNING: the Kafka cluster's stop reported a problem" >&2
bash "$HERE/postgres/stop.sh" || echo "[down] WARNING: PostgreSQL stop reported a problem" >&2
echo "[down] services stopped"
exit 0
