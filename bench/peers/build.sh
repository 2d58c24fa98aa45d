#!/usr/bin/env bash
# Build the peers the comparison bench (python -m bench.peerbench) runs, idempotently:
#   Kafka $KAFKA_VERSION  jars from Maven Central (kafka/pom.xml + mvn dependency:copy-dependencies)
#                         into ${HEADRACE_CACHE:-~/.cache/headrace}/kafka/<version>/libs
#   NATS  $NATS_VERSION   nats-server from its Go module into .../nats/<version>/bin, and
#         natscli $NATSCLI_VERSION (`nats bench`) beside it
# A stamp beside each says what built it; a matching stamp means nothing to do.
#   bench/peers/build.sh            build both (prints the two paths)
#   bench/peers/build.sh kafka|nats build one
#   bench/peers/build.sh --print    the paths only, build nothing
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
cache=${HEADRACE_CACHE:-$HOME/.cache/headrace}
kafka_dir=$cache/kafka/$KAFKA_VERSION
nats_bin=$cache/nats/$NATS_VERSION/bin
nice=${PEERS_NICE:-10}

if [[ ${1:-} == --print ]]; then
	echo "kafka_libs=$kafka_dir/libs"
	echo "nats_server=$nats_bin/nats-server"
	echo "nats_cli=$nats_bin/nats"
	exit 0
fi

build_kafka() {
	mkdir -p "$kafka_dir"
	exec 8>"$kafka_dir/.build.lock"
	flock 8
	local stamp
	stamp=$( (cat "$here/kafka/pom.xml" && echo "$KAFKA_VERSION") | sha256sum | cut -c1-16)
	if [[ -d $kafka_dir/libs && $(cat "$kafka_dir/.stamp" 2>/dev/null) == "$stamp" ]]; then
		echo "kafka_libs=$kafka_dir/libs"
		return
	fi
	if ! command -v mvn >/dev/null || ! command -v java >/dev/null; then
		# Debian's maven brings a JDK; as root (CI, the dev machines) install it, else say so
		if [[ $(id -u) -ne 0 ]]; then
			echo "build: mvn or java is missing: apt-get install maven openjdk-17-jre-headless" >&2
			exit 1
		fi
		DEBIAN_FRONTEND=noninteractive apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven openjdk-17-jre-headless >&2
	fi
	local tmp start
	tmp=$(mktemp -d "$kafka_dir/.tmp.XXXXXX")
	start=$(date +%s)
	echo "fetching Kafka $KAFKA_VERSION jars (one-time)" >&2
	nice -n "$nice" mvn -B -q -f "$here/kafka/pom.xml" -Dkafka.version="$KAFKA_VERSION" \
		dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tmp/libs" >&2
	rm -rf "$kafka_dir/libs"
	mv "$tmp/libs" "$kafka_dir/libs"
	rm -rf "$tmp"
	echo "$stamp" >"$kafka_dir/.stamp"
	echo "fetched Kafka in $(($(date +%s) - start)) s" >&2
	echo "kafka_libs=$kafka_dir/libs"
}

build_nats() {
	mkdir -p "$nats_bin"
	exec 7>"$nats_bin/.build.lock"
	flock 7
	export CGO_ENABLED=0 GOTOOLCHAIN=local
	local stamp
	stamp=$(printf '%s@%s\n%s@%s\n%s\n' "$NATS_MODULE" "$NATS_VERSION" "$NATSCLI_MODULE" "$NATSCLI_VERSION" "$(go version)" | sha256sum | cut -c1-16)
	if [[ -x $nats_bin/nats-server && -x $nats_bin/nats && $(cat "$nats_bin/.stamp" 2>/dev/null) == "$stamp" ]]; then
		echo "nats_server=$nats_bin/nats-server"
		echo "nats_cli=$nats_bin/nats"
		return
	fi
	local tmp start
	tmp=$(mktemp -d "$nats_bin/.tmp.XXXXXX")
	start=$(date +%s)
	echo "building nats-server $NATS_VERSION and natscli $NATSCLI_VERSION (one-time)" >&2
	GOBIN=$tmp nice -n "$nice" go install -trimpath -ldflags "-s -w" "$NATS_MODULE@$NATS_VERSION"
	GOBIN=$tmp nice -n "$nice" go install -trimpath -ldflags "-s -w" "$NATSCLI_MODULE@$NATSCLI_VERSION"
	mv -f "$tmp/nats-server" "$nats_bin/nats-server"
	mv -f "$tmp/nats" "$nats_bin/nats"
	rm -rf "$tmp"
	echo "$stamp" >"$nats_bin/.stamp"
	echo "built the NATS peers in $(($(date +%s) - start)) s" >&2
	echo "nats_server=$nats_bin/nats-server"
	echo "nats_cli=$nats_bin/nats"
}

case ${1:-all} in
kafka) build_kafka ;;
nats) build_nats ;;
all)
	build_kafka
	build_nats
	;;
*)
	echo "usage: $0 [kafka|nats|all|--print]" >&2
	exit 2
	;;
esac
