#!/usr/bin/env bash
# Start a throwaway single-node KRaft Kafka broker on 127.0.0.1, built from Maven Central jars
# (no Docker, no tarball). Every start formats a fresh, empty log dir.
#
# Usage: services/kafka/start.sh [--version 3|4]        (default 3 = Kafka 3.9.x; 4 = Kafka 4.x)
#
# Environment:
#   TOOLLEDGER_KAFKA_MAJOR            3 or 4 when --version is not given (KAFKA_MAJOR is accepted too)
#   TOOLLEDGER_KAFKA_PORT             client port (default 19092)
#   TOOLLEDGER_KAFKA_CONTROLLER_PORT  KRaft controller port (default: client port + 1, i.e. 19093)
#   TOOLLEDGER_KAFKA_VERSION          exact version override, e.g. 4.0.1 (default: pinned in pom.xml)
#   TOOLLEDGER_KAFKA_HEAP             JVM max heap (default 512m)
#   TOOLLEDGER_KAFKA_START_TIMEOUT    seconds to wait for readiness (default 120)
#   JAVA_HOME                         Java to use (default: java on PATH; Kafka 4.x needs Java 17+)
#
# Jars:  <repo>/.cache/kafka-<version>/libs   (Maven runs only when this cache is missing)
# State: <repo>/.services/kafka/<port>/       (server.properties, data/, logs/kafka.out, kafka.pid)
# Stop:  services/kafka/stop.sh
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)

log() { printf '[kafka] %s\n' "$*"; }
die() { printf '[kafka] ERROR: %s\n' "$*" >&2; exit 1; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
is_our_broker() {  # pid -> true when it is a live broker started by this script
  [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null \
    && tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -q -- '-Dtoolledger.service=kafka'
}

MAJOR=${TOOLLEDGER_KAFKA_MAJOR:-${KAFKA_MAJOR:-}}
while [ $# -gt 0 ]; do
  case "$1" in
    --version) [ $# -ge 2 ] || die "--version needs 3 or 4"; MAJOR=$2; shift 2 ;;
    --version=*) MAJOR=${1#*=}; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) die "unknown argument: $1 (usage: start.sh [--version 3|4])" ;;
  esac
done

VERSION=${TOOLLEDGER_KAFKA_VERSION:-}
if [ -n "$VERSION" ]; then
  [ -z "$MAJOR" ] && MAJOR=${VERSION%%.*}
  [ "${VERSION%%.*}" = "$MAJOR" ] || die "TOOLLEDGER_KAFKA_VERSION=$VERSION does not match --version $MAJOR"
fi
MAJOR=${MAJOR:-3}
case "$MAJOR" in 3|4) ;; *) die "--version must be 3 or 4, got '$MAJOR'" ;; esac
if [ -z "$VERSION" ]; then
  VERSION=$(sed -n "s:.*<kafka${MAJOR}.version>\([^<]*\)</kafka${MAJOR}.version>.*:\1:p" "$HERE/pom.xml" | head -n 1)
  [ -n "$VERSION" ] || die "cannot read <kafka${MAJOR}.version> from $HERE/pom.xml"
fi
[[ "$VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "bad Kafka version '$VERSION'"

PORT=${TOOLLEDGER_KAFKA_PORT:-19092}
[[ "$PORT" =~ ^[0-9]+$ ]] || die "TOOLLEDGER_KAFKA_PORT must be a number, got '$PORT'"
CPORT=${TOOLLEDGER_KAFKA_CONTROLLER_PORT:-$((PORT + 1))}
[[ "$CPORT" =~ ^[0-9]+$ ]] || die "TOOLLEDGER_KAFKA_CONTROLLER_PORT must be a number, got '$CPORT'"
[ "$PORT" != "$CPORT" ] || die "client and controller port are both $PORT"
HEAP=${TOOLLEDGER_KAFKA_HEAP:-512m}
TIMEOUT=${TOOLLEDGER_KAFKA_START_TIMEOUT:-120}
[[ "$TIMEOUT" =~ ^[0-9]+$ ]] || die "TOOLLEDGER_KAFKA_START_TIMEOUT must be a number of seconds"
T0=$SECONDS

# --- Java ------------------------------------------------------------------------------------------
JAVA="${JAVA_HOME:+$JAVA_HOME/bin/}java"
command -v "$JAVA" >/dev/null 2>&1 || die "java not found (install a JDK 17+ or set JAVA_HOME)"
JAVA_MAJOR=$("$JAVA" -version 2>&1 | sed -n 's/.*version "\([0-9][0-9.]*\).*/\1/p' | head -n 1)
JAVA_MAJOR=${JAVA_MAJOR#1.}; JAVA_MAJOR=${JAVA_MAJOR%%.*}
if [ -n "$JAVA_MAJOR" ]; then
  if [ "$MAJOR" = 4 ] && [ "$JAVA_MAJOR" -lt 17 ]; then die "Kafka 4.x needs Java 17+, found Java $JAVA_MAJOR"; fi
  if [ "$JAVA_MAJOR" -lt 11 ]; then die "Kafka 3.9 needs Java 11+, found Java $JAVA_MAJOR"; fi
fi

# --- already running? ------------------------------------------------------------------------------
WORK="$ROOT/.services/kafka/$PORT"
if [ -f "$WORK/kafka.pid" ]; then
  OLD_PID=$(cat "$WORK/kafka.pid" 2>/dev/null || true)
  if is_our_broker "$OLD_PID"; then
    RUNNING=$(cat "$WORK/version" 2>/dev/null || echo "?")
    if [ "$RUNNING" = "$VERSION" ] && port_open "$PORT"; then
      log "Kafka $VERSION already running on 127.0.0.1:$PORT (pid $OLD_PID); nothing to do"
      exit 0
    fi
    die "a broker (Kafka $RUNNING, pid $OLD_PID) is already running for port $PORT; run services/kafka/stop.sh first"
  fi
fi
for p in "$PORT" "$CPORT"; do
  port_open "$p" && die "127.0.0.1:$p is already in use by another process (set TOOLLEDGER_KAFKA_PORT / TOOLLEDGER_KAFKA_CONTROLLER_PORT)"
done

# --- jars: Maven Central -> .cache/kafka-<version>/libs (once) ---------------------------------------
CACHE="$ROOT/.cache/kafka-$VERSION"
LIBS="$CACHE/libs"
mkdir -p "$ROOT/.cache"
exec 9>"$ROOT/.cache/kafka-$VERSION.lock"
flock -w 900 9 || die "timed out waiting for another start.sh to finish collecting Kafka $VERSION jars"
# the cache is keyed by version and by pom.xml's content: editing the pom re-collects the jars
POM_SUM=$(sha256sum "$HERE/pom.xml" | cut -c1-16)
if [ "$(cat "$CACHE/complete" 2>/dev/null)" = "pom-$POM_SUM" ] && [ -f "$LIBS/kafka_2.13-$VERSION.jar" ]; then
  log "using cached Kafka $VERSION jars ($(find "$LIBS" -name '*.jar' | wc -l) jars in ${LIBS#"$ROOT"/})"
else
  command -v mvn >/dev/null 2>&1 || die "mvn not found: Maven 3.8+ is needed once to collect the Kafka jars"
  log "collecting Kafka $VERSION jars from Maven Central into ${LIBS#"$ROOT"/} (first run only) ..."
  rm -rf "$CACHE"
  mkdir -p "$CACHE"
  MVN_ARGS=(-B -ntp -q -Dstyle.color=never -f "$HERE/pom.xml" package
            "-Dkafka.version=$VERSION"
            "-Dkafka.libs.dir=$CACHE/libs.partial"
            "-Dkafka.build.dir=$ROOT/.cache/kafka-maven-target")
  [ "$MAJOR" = 4 ] && MVN_ARGS+=(-Pkafka4)
  T_MVN=$SECONDS
  MVN_LOG="$ROOT/.cache/kafka-$VERSION-maven.log"
  if ! mvn "${MVN_ARGS[@]}" >"$MVN_LOG" 2>&1; then
    tail -n 40 "$MVN_LOG" >&2
    rm -rf "$CACHE"
    die "Maven could not collect the Kafka $VERSION jars (full output: ${MVN_LOG#"$ROOT"/})"
  fi
  [ -f "$CACHE/libs.partial/kafka_2.13-$VERSION.jar" ] || { rm -rf "$CACHE"; die "Maven finished but kafka_2.13-$VERSION.jar is missing"; }
  mv "$CACHE/libs.partial" "$LIBS"
  printf 'pom-%s\n' "$POM_SUM" >"$CACHE/complete"
  log "collected $(find "$LIBS" -name '*.jar' | wc -l) jars in $((SECONDS - T_MVN)) s"
fi
flock -u 9
exec 9>&-

# exactly one SLF4J binding, or the broker logs nothing / complains
BINDINGS=$(find "$LIBS" -maxdepth 1 \( -name 'slf4j-reload4j-*.jar' -o -name 'log4j-slf4j-impl-*.jar' \
             -o -name 'log4j-slf4j2-impl-*.jar' -o -name 'logback-classic-*.jar' -o -name 'slf4j-log4j12-*.jar' \) | wc -l)
[ "$BINDINGS" -ge 1 ] || die "no SLF4J binding in $LIBS: the broker would log nothing (delete ${CACHE#"$ROOT"/} and check pom.xml)"
[ "$BINDINGS" -eq 1 ] || log "WARNING: expected exactly one SLF4J binding in $LIBS, found $BINDINGS"
if compgen -G "$LIBS/log4j-core-*.jar" >/dev/null; then     # Kafka 4.x: log4j2
  LOGOPT="-Dlog4j2.configurationFile=$HERE/log4j2.properties"
else                                                        # Kafka 3.x: reload4j
  LOGOPT="-Dlog4j.configuration=file:$HERE/log4j.properties"
fi

# --- fresh work dir + config -----------------------------------------------------------------------
rm -rf "$WORK"
mkdir -p "$WORK/data" "$WORK/logs"
while IFS= read -r line || [ -n "$line" ]; do
  line=${line//@PORT@/$PORT}; line=${line//@CPORT@/$CPORT}; line=${line//@DATA_DIR@/$WORK/data}
  printf '%s\n' "$line"
done <"$HERE/server.properties.in" >"$WORK/server.properties"

COMMON=(-Djava.awt.headless=true "-Dkafka.logs.dir=$WORK/logs" "$LOGOPT" -cp "$LIBS/*")

# cluster id as 'kafka-storage.sh random-uuid' makes it: 16 random bytes, base64url, no padding,
# not starting with '-' (the CLI would take it for an option)
CID=-
while [ "${CID#-}" != "$CID" ]; do
  CID=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
done
log "formatting KRaft storage (cluster id $CID) in ${WORK#"$ROOT"/}"
if ! "$JAVA" -Xmx256m "${COMMON[@]}" kafka.tools.StorageTool format -t "$CID" \
      -c "$WORK/server.properties" >"$WORK/logs/format.out" 2>&1; then
  cat "$WORK/logs/format.out" >&2
  die "kafka-storage format failed"
fi

# --- start (own session, survives this shell) ------------------------------------------------------
log "starting Kafka $VERSION on 127.0.0.1:$PORT (controller 127.0.0.1:$CPORT, heap $HEAP)"
# shellcheck disable=SC2016  # $$ and $@ are for the inner bash
setsid bash -c 'echo $$ >"$0"; exec "$@"' "$WORK/kafka.pid" \
  "$JAVA" -Xms128m "-Xmx$HEAP" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError \
  "-Dtoolledger.service=kafka-$PORT" "${COMMON[@]}" kafka.Kafka "$WORK/server.properties" \
  </dev/null >"$WORK/logs/kafka.out" 2>&1 &
printf '%s\n' "$VERSION" >"$WORK/version"

PID=""
fail() {
  log "ERROR: $*" >&2
  echo "----- last lines of ${WORK#"$ROOT"/}/logs/kafka.out -----" >&2
  tail -n 60 "$WORK/logs/kafka.out" >&2 || true
  bash "$HERE/stop.sh" >&2 || true
  exit 1
}
trap 'fail "interrupted"' INT TERM

DEADLINE=$((SECONDS + TIMEOUT)); NEXT_NOTE=$((SECONDS + 10))
while :; do
  [ -n "$PID" ] || PID=$(cat "$WORK/kafka.pid" 2>/dev/null || true)
  if [ -n "$PID" ] && grep -q "Kafka Server started" "$WORK/logs/kafka.out" 2>/dev/null && port_open "$PORT"; then
    break
  fi
  if [ -n "$PID" ] && ! kill -0 "$PID" 2>/dev/null; then fail "Kafka exited during startup"; fi
  [ "$SECONDS" -lt "$DEADLINE" ] || fail "Kafka was not ready within $TIMEOUT s"
  if [ "$SECONDS" -ge "$NEXT_NOTE" ]; then
    log "... waiting for the broker ($((SECONDS - T0)) s)"; NEXT_NOTE=$((SECONDS + 10))
  fi
  sleep 0.5
done
trap - INT TERM
log "Kafka $VERSION ready on 127.0.0.1:$PORT (pid $PID) after $((SECONDS - T0)) s; log: ${WORK#"$ROOT"/}/logs/kafka.out"
