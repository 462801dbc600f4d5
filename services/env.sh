# shellcheck shell=sh
# Connection settings for the services started by services/up.sh (docker-compose.yml uses the same
# ports). Source it, from any POSIX shell (make recipes run /bin/sh):   . services/env.sh
#
#   TOOLLEDGER_KAFKA     Kafka bootstrap servers   (default 127.0.0.1:$TOOLLEDGER_KAFKA_PORT, port 19092)
#   TOOLLEDGER_POSTGRES  PostgreSQL conninfo URL   (default postgresql://postgres@127.0.0.1:$TOOLLEDGER_PG_PORT/toolledger,
#                                                   port 15432)
# Values that are already set are kept, so CI or a developer can point the tests at other servers.
export TOOLLEDGER_KAFKA="${TOOLLEDGER_KAFKA:-127.0.0.1:${TOOLLEDGER_KAFKA_PORT:-19092}}"
export TOOLLEDGER_POSTGRES="${TOOLLEDGER_POSTGRES:-postgresql://postgres@127.0.0.1:${TOOLLEDGER_PG_PORT:-15432}/toolledger}"
