#!/usr/bin/env bash
# Build the MinIO server from its Go module with `go install`; idempotent.
#
#   tools/minio/build.sh           build if missing or stale, print the binary's path
#   tools/minio/build.sh --bin     print the binary's path only (it may not exist yet)
#
# The binary goes to ${MINIO_BIN_DIR:-${HEADRACE_CACHE:-$HOME/.cache/headrace}/minio/<version>/bin},
# outside the repository. A stamp (module version, Go version, flags) beside it says what
# built it; a matching stamp and an executable binary mean there is nothing to do.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=version.env
. "$here/version.env"

cache=${HEADRACE_CACHE:-$HOME/.cache/headrace}
bin=${MINIO_BIN_DIR:-$cache/minio/$MINIO_VERSION/bin}
if [[ ${1:-} == --bin ]]; then
	echo "$bin/minio"
	exit 0
fi

# A static binary like upstream's; never download a toolchain.
export CGO_ENABLED=0 GOTOOLCHAIN=local
ldflags="-s -w"
flags="-trimpath"
nice=${MINIO_NICE:-10}

mkdir -p "$bin"
exec 9>"$bin/.build.lock"
flock 9 # make and a test session may both ask for it; the second waits, then finds it built

stamp=$(printf '%s@%s\n%s\n%s %s\n' "$MINIO_MODULE" "$MINIO_VERSION" "$(go version)" "$flags" "$ldflags" | sha256sum | cut -c1-16)
if [[ -x $bin/minio && $(cat "$bin/.stamp" 2>/dev/null) == "$stamp" ]]; then
	echo "$bin/minio"
	exit 0
fi

tmp=$(mktemp -d "$bin/.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
echo "building minio $MINIO_VERSION (one-time; several minutes on a cold Go cache)" >&2
GOBIN=$tmp nice -n "$nice" go install $flags -ldflags "$ldflags" "$MINIO_MODULE@$MINIO_VERSION"
mv -f "$tmp/minio" "$bin/minio"
echo "$stamp" >"$bin/.stamp"
echo "built minio in $(($(date +%s) - start)) s" >&2
echo "$bin/minio"
