# shellcheck shell=bash
# Shared by services/kafka/start.sh and services/kafka-cluster/*.sh (sourced; needs ROOT set to the
# repository and a log/die pair defined by the caller).
#
#   kafka_version MAJOR        sets MAJOR and VERSION (TOOLLEDGER_KAFKA_VERSION, else pom.xml's pin)
#   kafka_java                 sets JAVA; dies when Java is missing or too old for MAJOR
#   kafka_libs                 sets LIBS and LOGOPT; collects the jars from Maven Central once
#   kafka_cluster_id           prints a fresh KRaft cluster id
#   kafka_render IN OUT K=V..  writes template IN to OUT with every @K@ replaced by V
#   kafka_format WORK CID      formats WORK/data for WORK/server.properties (needs JAVA, LIBS, LOGOPT)
#   kafka_launch WORK NAME     starts kafka.Kafka WORK/server.properties in its own session: pid in
#                              WORK/kafka.pid, output appended to WORK/logs/kafka.out, heap HEAP
#                              (TOOLLEDGER_KAFKA_HEAP, default 512m); NAME marks the process
#   port_open PORT             true when 127.0.0.1:PORT accepts a connection
#   is_our_broker PID          true when PID is a live broker started by these scripts
KAFKA_SERVICE_DIR="$ROOT/services/kafka"
HEAP=${TOOLLEDGER_KAFKA_HEAP:-512m}  # JVM max heap of each broker

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
is_our_broker() {
  [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null \
    && tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -q -- '-Dtoolledger.service=kafka'
}

kafka_version() {  # requested major (may be empty)
  MAJOR=$1
  VERSION=${TOOLLEDGER_KAFKA_VERSION:-}
  if [ -n "$VERSION" ]; then
    [ -z "$MAJOR" ] && MAJOR=${VERSION%%.*}
    [ "${VERSION%%.*}" = "$MAJOR" ] || die "TOOLLEDGER_KAFKA_VERSION=$VERSION does not match --version $MAJOR"
  fi
  MAJOR=${MAJOR:-3}
  case "$MAJOR" in 3|4) ;; *) die "--version must be 3 or 4, got '$MAJOR'" ;; esac
  if [ -z "$VERSION" ]; then
    VERSION=$(sed -n "s:.*<kafka${MAJOR}.version>\([^<]*\)</kafka${MAJOR}.version>.*:\1:p" \
      "$KAFKA_SERVICE_DIR/pom.xml" | head -n 1)
    [ -n "$VERSION" ] || die "cannot read <kafka${MAJOR}.version> from $KAFKA_SERVICE_DIR/pom.xml"
  fi
  [[ "$VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "bad Kafka version '$VERSION'"
}

kafka_java() {
  local java_major
  JAVA="${JAVA_HOME:+$JAVA_HOME/bin/}java"
  command -v "$JAVA" >/dev/null 2>&1 || die "java not found (install a JDK 17+ or set JAVA_HOME)"
  java_major=$("$JAVA" -version 2>&1 | sed -n 's/.*version "\([0-9][0-9.]*\).*/\1/p' | head -n 1)
  java_major=${java_major#1.}; java_major=${java_major%%.*}
  if [ -n "$java_major" ]; then
    if [ "$MAJOR" = 4 ] && [ "$java_major" -lt 17 ]; then die "Kafka 4.x needs Java 17+, found Java $java_major"; fi
    if [ "$java_major" -lt 11 ]; then die "Kafka 3.9 needs Java 11+, found Java $java_major"; fi
  fi
}

# Jars: <repo>/.cache/kafka-<version>/libs, collected by Maven when missing (or when pom.xml changed).
kafka_libs() {
  local cache pom_sum mvn_log t_mvn bindings
  local -a mvn_args
  cache="$ROOT/.cache/kafka-$VERSION"
  LIBS="$cache/libs"
  mkdir -p "$ROOT/.cache"
  exec 9>"$ROOT/.cache/kafka-$VERSION.lock"
  flock -w 900 9 || die "timed out waiting for another start.sh to finish collecting Kafka $VERSION jars"
  # the cache is keyed by version and by pom.xml's content: editing the pom re-collects the jars
  pom_sum=$(sha256sum "$KAFKA_SERVICE_DIR/pom.xml" | cut -c1-16)
  if [ "$(cat "$cache/complete" 2>/dev/null)" = "pom-$pom_sum" ] && [ -f "$LIBS/kafka_2.13-$VERSION.jar" ]; then
    log "using cached Kafka $VERSION jars ($(find "$LIBS" -name '*.jar' | wc -l) jars in ${LIBS#"$ROOT"/})"
  else
    command -v mvn >/dev/null 2>&1 || die "mvn not found: Maven 3.8+ is needed once to collect the Kafka jars"
    log "collecting Kafka $VERSION jars from Maven Central into ${LIBS#"$ROOT"/} (first run only) ..."
    rm -rf "$cache"
    mkdir -p "$cache"
    mvn_args=(-B -ntp -q -Dstyle.color=never -f "$KAFKA_SERVICE_DIR/pom.xml" package
              "-Dkafka.version=$VERSION"
              "-Dkafka.libs.dir=$cache/libs.partial"
              "-Dkafka.build.dir=$ROOT/.cache/kafka-maven-target")
    [ "$MAJOR" = 4 ] && mvn_args+=(-Pkafka4)
    t_mvn=$SECONDS
    mvn_log="$ROOT/.cache/kafka-$VERSION-maven.log"
    if ! mvn "${mvn_args[@]}" >"$mvn_log" 2>&1; then
      tail -n 40 "$mvn_log" >&2
      rm -rf "$cache"
      die "Maven could not collect the Kafka $VERSION jars (full output: ${mvn_log#"$ROOT"/})"
    fi
    [ -f "$cache/libs.partial/kafka_2.13-$VERSION.jar" ] || { rm -rf "$cache"; die "Maven finished but kafka_2.13-$VERSION.jar is missing"; }
    mv "$cache/libs.partial" "$LIBS"
    printf 'pom-%s\n' "$pom_sum" >"$cache/complete"
    log "collected $(find "$LIBS" -name '*.jar' | wc -l) jars in $((SECONDS - t_mvn)) s"
  fi
  flock -u 9
  exec 9>&-

  # exactly one SLF4J binding, or the broker logs nothing / complains
  bindings=$(find "$LIBS" -maxdepth 1 \( -name 'slf4j-reload4j-*.jar' -o -name 'log4j-slf4j-impl-*.jar' \
               -o -name 'log4j-slf4j2-impl-*.jar' -o -name 'logback-classic-*.jar' -o -name 'slf4j-log4j12-*.jar' \) | wc -l)
  [ "$bindings" -ge 1 ] || die "no SLF4J binding in $LIBS: the broker would log nothing (delete ${cache#"$ROOT"/} and check pom.xml)"
  [ "$bindings" -eq 1 ] || log "WARNING: expected exactly one SLF4J binding in $LIBS, found $bindings"
  if compgen -G "$LIBS/log4j-core-*.jar" >/dev/null; then     # Kafka 4.x: log4j2
    LOGOPT="-Dlog4j2.configurationFile=$KAFKA_SERVICE_DIR/log4j2.properties"
  else                                                        # Kafka 3.x: reload4j
    LOGOPT="-Dlog4j.configuration=file:$KAFKA_SERVICE_DIR/log4j.properties"
  fi
}

# as 'kafka-storage.sh random-uuid' makes it: 16 random bytes, base64url, no padding, not starting
# with '-' (the CLI would take it for an option)
kafka_cluster_id() {
  local cid=-
  while [ "${cid#-}" != "$cid" ]; do
    cid=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
  done
  printf '%s\n' "$cid"
}

kafka_render() {  # template, output, NAME=VALUE...
  local template=$1 out=$2 line pair
  shift 2
  while IFS= read -r line || [ -n "$line" ]; do
    for pair in "$@"; do line=${line//@${pair%%=*}@/${pair#*=}}; done
    printf '%s\n' "$line"
  done <"$template" >"$out"
}

kafka_format() {  # work dir, cluster id
  if ! "$JAVA" -Xmx256m -Djava.awt.headless=true "-Dkafka.logs.dir=$1/logs" "$LOGOPT" -cp "$LIBS/*" \
        kafka.tools.StorageTool format -t "$2" -c "$1/server.properties" >"$1/logs/format.out" 2>&1; then
    cat "$1/logs/format.out" >&2
    die "kafka-storage format failed in $1"
  fi
}

kafka_launch() {  # work dir, process name
  # shellcheck disable=SC2016  # $$ and $@ are for the inner bash
  setsid bash -c 'echo $$ >"$0"; exec "$@"' "$1/kafka.pid" \
    "$JAVA" -Xms128m "-Xmx$HEAP" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
    -XX:+ExitOnOutOfMemoryError "-Dtoolledger.service=$2" -Djava.awt.headless=true \
    "-Dkafka.logs.dir=$1/logs" "$LOGOPT" -cp "$LIBS/*" kafka.Kafka "$1/server.properties" \
    </dev/null >>"$1/logs/kafka.out" 2>&1 &
}
