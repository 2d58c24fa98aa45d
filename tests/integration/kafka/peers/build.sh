#!/usr/bin/env bash
# Build the Kafka peers that tests/integration/kafka/test_kafka_peers.py runs, idempotently,
# into ${HEADRACE_CACHE:-~/.cache/headrace} (outside the repository). Prints name=path lines.
#   build.sh java     Kafka's client and tools jars from Maven Central: bench/peers/build.sh
#                     kafka (one cache and one pinned version with the comparison bench)
#   build.sh franzgo  franzgo/ (franz-go from the Go module proxy) into .../kafka-peers/franzgo/<stamp>/
#   build.sh kcat     Debian's kcat (apt-get, as root, when it is not installed)
#   build.sh spark    Spark's Kafka source and sink (spark-sql-kafka-0-10) and the jars it needs
#                     beside pyspark's, from Maven Central (spark/pom.xml), into
#                     .../kafka-peers/spark-kafka/<version>/jars
#   build.sh          all four
#   build.sh kgo-src  franz-go's own source at franzgo/go.mod's version (its pkg/kgo test suite,
#                     for kgo_suite.py; not in `all`) into .../kafka-peers/franz-go-src/<version>/
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../../.." && pwd)
cache=${HEADRACE_CACHE:-$HOME/.cache/headrace}
nice=${PEERS_NICE:-10}
# The connector of the pyspark we use (Scala 2.13 builds) when Maven Central has it: it has
# no 4.3 connector yet, so pyspark 4.3 runs the 4.2 one (the newest release), whose DataSource
# V2 and kafka-clients 3.9 calls Spark 4.3 still serves.
SPARK_KAFKA_VERSION=4.2.0
SPARK_SCALA=2.13

build_java() {
	bash "$repo/bench/peers/build.sh" kafka
}

build_franzgo() {
	# a static binary; never download a toolchain (go.mod's go line is the machine's)
	export CGO_ENABLED=0 GOTOOLCHAIN=local
	local stamp dir flags=(-trimpath -buildvcs=false -ldflags "-s -w")
	stamp=$( (cat "$here/franzgo/go.mod" "$here/franzgo/go.sum" "$here/franzgo/main.go" && go version && echo "${flags[*]}") | sha256sum | cut -c1-16)
	dir=$cache/kafka-peers/franzgo/$stamp
	mkdir -p "$dir"
	exec 9>"$dir/.build.lock"
	flock 9 # make and a test session may both ask; the second waits, then finds it built
	if [[ ! -x $dir/franzgo ]]; then
		local start
		start=$(date +%s)
		echo "building franzgo (franz-go from the Go module proxy; one-time)" >&2
		(cd "$here/franzgo" && nice -n "$nice" go build "${flags[@]}" -o "$dir/franzgo.tmp" .)
		mv -f "$dir/franzgo.tmp" "$dir/franzgo"
		echo "built franzgo in $(($(date +%s) - start)) s" >&2
	fi
	echo "franzgo=$dir/franzgo"
}

build_kgo_src() {
	# franz-go's module zip from the Go module proxy, at the version our program pins, copied
	# out of the read-only module cache. One change to its tests (kgo_suite.py says why):
	# randsha, which names their topics, gives 63 hex digits instead of 64.
	export GOTOOLCHAIN=local GOFLAGS=-mod=mod
	local version src dir
	version=$(awk '$1 == "require" && $2 == "github.com/twmb/franz-go" {print $3}' "$here/franzgo/go.mod")
	dir=$cache/kafka-peers/franz-go-src/$version
	mkdir -p "$(dirname "$dir")"
	exec 8>"$dir.lock"
	flock 8
	if [[ ! -f $dir/.patched ]]; then
		src=$(go mod download -json "github.com/twmb/franz-go@$version" | awk -F'"' '$2 == "Dir" {print $4}')
		rm -rf "$dir"
		cp -r "$src" "$dir"
		chmod -R u+w "$dir"
		local helpers=$dir/pkg/kgo/helpers_test.go
		grep -q 'return hex.EncodeToString(sum\[:\])$' "$helpers"
		sed -i 's/return hex.EncodeToString(sum\[:\])$/return hex.EncodeToString(sum[:])[:63]/' "$helpers"
		(cd "$dir" && go mod download)
		touch "$dir/.patched"
	fi
	echo "kgosrc=$dir"
}

build_kcat() {
	if ! command -v kcat >/dev/null; then
		if [[ $(id -u) -ne 0 ]]; then
			echo "build: kcat is missing: apt-get install kcat" >&2
			exit 1
		fi
		DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kcat >&2
	fi
	echo "kcat=$(command -v kcat)"
}

build_spark() {
	local dir=$cache/kafka-peers/spark-kafka/${SPARK_KAFKA_VERSION}_$SPARK_SCALA
	mkdir -p "$dir"
	exec 9>"$dir/.build.lock"
	flock 9
	local stamp
	stamp=$( (cat "$here/spark/pom.xml" && echo "$SPARK_KAFKA_VERSION $SPARK_SCALA") | sha256sum | cut -c1-16)
	if [[ -d $dir/jars && $(cat "$dir/.stamp" 2>/dev/null) == "$stamp" ]]; then
		echo "spark_kafka_jars=$dir/jars"
		return
	fi
	if ! command -v mvn >/dev/null; then
		if [[ $(id -u) -ne 0 ]]; then
			echo "build: mvn is missing: apt-get install maven" >&2
			exit 1
		fi
		DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven >&2
	fi
	local tmp start
	tmp=$(mktemp -d "$dir/.tmp.XXXXXX")
	start=$(date +%s)
	echo "fetching spark-sql-kafka-0-10_$SPARK_SCALA $SPARK_KAFKA_VERSION (one-time)" >&2
	# only the connector and what pyspark does not ship: a second lz4, snappy or Hadoop on
	# the class path would shadow pyspark's own
	nice -n "$nice" mvn -B -q -f "$here/spark/pom.xml" -Dspark.version="$SPARK_KAFKA_VERSION" \
		-Dscala.binary.version="$SPARK_SCALA" dependency:copy-dependencies \
		-DincludeArtifactIds="spark-sql-kafka-0-10_$SPARK_SCALA,spark-token-provider-kafka-0-10_$SPARK_SCALA,kafka-clients,commons-pool2" \
		-DoutputDirectory="$tmp/jars" >&2
	rm -rf "$dir/jars"
	mv "$tmp/jars" "$dir/jars"
	rm -rf "$tmp"
	echo "$stamp" >"$dir/.stamp"
	echo "fetched Spark's Kafka connector in $(($(date +%s) - start)) s" >&2
	echo "spark_kafka_jars=$dir/jars"
}

case ${1:-all} in
java) build_java ;;
franzgo) build_franzgo ;;
kcat) build_kcat ;;
spark) build_spark ;;
kgo-src) build_kgo_src ;;
all)
	build_java
	build_franzgo
	build_kcat
	build_spark
	;;
*)
	echo "usage: $0 [java|franzgo|kcat|spark|kgo-src|all]" >&2
	exit 2
	;;
esac
