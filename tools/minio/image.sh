#!/usr/bin/env bash
# The MinIO image a real node runs (the chart's `minio.enabled`, E2E_NODE=real): the server
# tools/minio/build.sh builds from its Go module, alone in the image, as the chart's user;
# nothing is pulled. Prints the image's reference. Kept in buildah's store once built: the
# tag names the module version and the Go version that built it.
#   tools/minio/image.sh        build if missing, print localhost/headrace-minio:<tag>
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=version.env
. "$here/version.env"
export STORAGE_DRIVER=${STORAGE_DRIVER:-vfs}
buildah=(buildah --storage-driver "$STORAGE_DRIVER")
go_version=$(go env GOVERSION)
IMAGE=${IMAGE:-localhost/headrace-minio:${MINIO_VERSION##*-}-$go_version}
if "${buildah[@]}" inspect --type image "$IMAGE" >/dev/null 2>&1; then
	echo "$IMAGE"
	exit 0
fi
minio=$(bash "$here/build.sh")
ctr=$("${buildah[@]}" from scratch)
trap '"${buildah[@]}" rm "$ctr" >/dev/null 2>&1 || true' EXIT
"${buildah[@]}" copy "$ctr" "$minio" /usr/bin/minio >/dev/null
# the chart runs `minio server /data ...` as uid 10001, /tmp an emptyDir
"${buildah[@]}" config --env PATH=/usr/bin --user 10001:10001 \
	--entrypoint '["minio"]' --cmd '' "$ctr"
"${buildah[@]}" commit -q "$ctr" "$IMAGE" >/dev/null
echo "$IMAGE"
