#!/usr/bin/env bash
# Build tools/kstatus (a wrapper of sigs.k8s.io/cli-utils/pkg/kstatus) like the test bed
# builds Kubernetes: from the Go module proxy, go.sum pinned, cached; idempotent.
#   tools/kstatus/build.sh     print the binary's path, building it when missing or stale
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${HEADRACE_CACHE:-$HOME/.cache/headrace}
version=$(awk '$1 == "sigs.k8s.io/cli-utils" {print $2}' "$here/go.mod")
bin=$cache/kstatus/$version/bin
export CGO_ENABLED=0 GOTOOLCHAIN=local
export GOFLAGS="${GOFLAGS:-} -mod=readonly -trimpath"
stamp=$(cat "$here/go.mod" "$here/go.sum" "$here/main.go" <(go version) | sha256sum | cut -c1-16)
mkdir -p "$bin"
exec 9>"$bin/.build.lock"
flock 9
if [[ ! -x $bin/kstatus || $(cat "$bin/.stamp" 2>/dev/null) != "$stamp" ]]; then
	(cd "$here" && nice -n "${TESTBED_NICE:-10}" go build -ldflags "-s -w" -o "$bin/kstatus.tmp" .)
	mv -f "$bin/kstatus.tmp" "$bin/kstatus"
	echo "$stamp" >"$bin/.stamp"
fi
echo "$bin/kstatus"
