#!/usr/bin/env bash
# One node of the cluster started by services/kafka-cluster/start.sh, keeping its data:
#   kill N      SIGKILL (a crash: no controlled shutdown, nothing flushed)
#   stop N      SIGTERM (controlled shutdown: its leaderships move first), SIGKILL after 60 s
#   start N     start it again and wait until it serves (TOOLLEDGER_KAFKA_START_TIMEOUT, default 180 s)
#   restart N   stop, then start
# N is the node id, 1 to 3 (its client port is TOOLLEDGER_KAFKA_CLUSTER_PORT + N - 1).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
log() { printf '[kafka-cluster] %s\n' "$*"; }
die() { printf '[kafka-cluster] ERROR: %s\n' "$*" >&2; exit 1; }
# shellcheck source=services/kafka-cluster/common.sh
. "$HERE/common.sh"

usage="usage: node.sh kill|stop|start|restart N (N = 1, 2 or 3)"
[ $# -eq 2 ] || die "$usage"
ACTION=$1 N=$2
[[ " ${NODES[*]} " == *" $N "* ]] || die "$usage"
[ -f "$(node_work "$N")/server.properties" ] || die "no cluster in ${CLUSTER#"$ROOT"/}: run start.sh first"

start() {
  local before
  node_pid "$N" >/dev/null && die "node $N already runs"
  TOOLLEDGER_KAFKA_VERSION=$(cat "$CLUSTER/version") kafka_version ""
  kafka_java
  kafka_libs >/dev/null
  before=$(started_count "$N")
  launch_node "$N"
  wait_started "$N" "$before" $((SECONDS + START_TIMEOUT)) || die "node $N did not come back"
  log "node $N serves on 127.0.0.1:$(node_port "$N") (pid $(node_pid "$N"))"
}

case "$ACTION" in
  kill) stop_node "$N" KILL ;;
  stop) stop_node "$N" TERM ;;
  start) start ;;
  restart) stop_node "$N" TERM && start ;;
  *) die "$usage" ;;
esac
