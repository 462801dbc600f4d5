# shellcheck shell=bash
# Shared by services/kafka-cluster/start.sh, stop.sh and node.sh (sourced; needs ROOT set).
#
# Ports: TOOLLEDGER_KAFKA_CLUSTER_PORT = BASE (default 19100): node N (1..3) serves clients on
# BASE+N-1 and its controller on BASE+N+2, so the defaults (19100-19105) stay clear of the single
# broker (19092/19093) and PostgreSQL (15432).
# State: <repo>/.services/kafka-cluster/<BASE>/{version,bootstrap,node-N/{server.properties,data,
# logs/kafka.out,kafka.pid}}
NODES=(1 2 3)
BASE=${TOOLLEDGER_KAFKA_CLUSTER_PORT:-19100}
[[ "$BASE" =~ ^[0-9]+$ ]] || die "TOOLLEDGER_KAFKA_CLUSTER_PORT must be a number, got '$BASE'"
CLUSTER="$ROOT/.services/kafka-cluster/$BASE"
START_TIMEOUT=${TOOLLEDGER_KAFKA_START_TIMEOUT:-180}
STOP_TIMEOUT=${TOOLLEDGER_KAFKA_STOP_TIMEOUT:-60}
[[ "$START_TIMEOUT$STOP_TIMEOUT" =~ ^[0-9]+$ ]] \
  || die "TOOLLEDGER_KAFKA_START_TIMEOUT and TOOLLEDGER_KAFKA_STOP_TIMEOUT are seconds"

# shellcheck source=services/kafka/common.sh
. "$ROOT/services/kafka/common.sh"

node_port() { printf '%s\n' $((BASE + $1 - 1)); }
node_cport() { printf '%s\n' $((BASE + $1 + 2)); }
node_work() { printf '%s\n' "$CLUSTER/node-$1"; }
node_pid() {  # prints the pid of node N when it runs; false otherwise
  local pid
  pid=$(cat "$(node_work "$1")/kafka.pid" 2>/dev/null) && is_our_broker "$pid" && printf '%s\n' "$pid"
}
bootstrap() {
  local n out=""
  for n in "${NODES[@]}"; do out+="${out:+,}127.0.0.1:$(node_port "$n")"; done
  printf '%s\n' "$out"
}
started_count() { grep -c "Kafka Server started" "$(node_work "$1")/logs/kafka.out" 2>/dev/null || true; }

# wait until node N has logged one more "Kafka Server started" than BEFORE and serves its port
wait_started() {  # node, before, deadline (in $SECONDS)
  local work pid
  work=$(node_work "$1")
  while :; do
    pid=$(cat "$work/kafka.pid" 2>/dev/null || true)
    if [ "$(started_count "$1")" -gt "$2" ] && port_open "$(node_port "$1")"; then return 0; fi
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
      log "node $1 exited during startup; last lines of ${work#"$ROOT"/}/logs/kafka.out:" >&2
      tail -n 40 "$work/logs/kafka.out" >&2
      return 1
    fi
    if [ "$SECONDS" -ge "$3" ]; then
      log "node $1 was not ready in time; last lines of ${work#"$ROOT"/}/logs/kafka.out:" >&2
      tail -n 40 "$work/logs/kafka.out" >&2
      return 1
    fi
    sleep 0.5
  done
}

# stop node N with SIGNAL (TERM: controlled shutdown; KILL: as a crash), SIGKILL after STOP_TIMEOUT
stop_node() {  # node, signal
  local pid i
  pid=$(node_pid "$1") || { rm -f "$(node_work "$1")/kafka.pid"; return 0; }
  kill "-$2" "$pid" 2>/dev/null || true
  for ((i = 0; i < STOP_TIMEOUT * 4; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.25
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "node $1 (pid $pid) still running after $STOP_TIMEOUT s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 40; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  fi
  kill -0 "$pid" 2>/dev/null && { log "ERROR: node $1 (pid $pid) survived SIGKILL" >&2; return 1; }
  rm -f "$(node_work "$1")/kafka.pid"
  log "node $1 stopped (SIG$2, pid $pid)"
}

# start node N on its existing data (the Java and jars of the version it was formatted with)
launch_node() {  # node
  kafka_launch "$(node_work "$1")" "kafka-cluster-$(node_port "$1")"
}
