#!/usr/bin/env bash
# Stop the three-node cluster started by services/kafka-cluster/start.sh: SIGTERM to every node,
# SIGKILL after TOOLLEDGER_KAFKA_STOP_TIMEOUT seconds (default 60). Safe when nothing runs.
#
# Usage: services/kafka-cluster/stop.sh        (the cluster of TOOLLEDGER_KAFKA_CLUSTER_PORT)
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
log() { printf '[kafka-cluster] %s\n' "$*"; }
die() { printf '[kafka-cluster] ERROR: %s\n' "$*" >&2; exit 1; }
# shellcheck source=services/kafka-cluster/common.sh
. "$HERE/common.sh"

[ $# -eq 0 ] || die "stop.sh takes no arguments"
rc=0
PIDS=()
for n in "${NODES[@]}"; do stop_node "$n" TERM & PIDS+=($!); done
for pid in "${PIDS[@]}"; do wait "$pid" || rc=1; done
exit "$rc"
