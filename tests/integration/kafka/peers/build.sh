#!/usr/bin/env bash
# Build the Kafka peers that tests/integration/kafka/test_kafka_peers.py runs, idempotently,
# into ${HEADRACE_CACHE:-~/.cache/headrace} (outside the repository). Prints name=path lines.
#   build.sh java     Kafka's client and tools jars from Maven Central: bench/peers/build.sh
#                     kafka (one cache and one pinned version with the comparison bench)
#   build.sh franzgo  franzgo/ (franz-go from the Go module proxy) into .../kafka-peers/franzgo/<stamp>/
#   build.sh kcat     Debian's kcat (apt-get, as root, when it is not installed)
#   build.sh          all three
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../../.." && pwd)
cache=${HEADRACE_CACHE:-$HOME/.cache/headrace}
nice=${PEERS_NICE:-10}

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

case ${1:-all} in
java) build_java ;;
franzgo) build_franzgo ;;
kcat) build_kcat ;;
all)
	build_java
	build_franzgo
	build_kcat
	;;
*)
	echo "usage: $0 [java|franzgo|kcat|all]" >&2
	exit 2
	;;
esac
