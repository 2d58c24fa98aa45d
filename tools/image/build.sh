#!/usr/bin/env bash
# Build a headrace image with buildah (no Docker engine needed) and check that it runs.
#   build.sh [headrace]  the broker/operator image (`make image`): Containerfile, the
#                        extras broker, operator, tiered, compression; no Java
#   build.sh spark       the Spark image (`make image-spark`): Containerfile.spark, the
#                        extras broker, tiered, compression, jobs (pyspark, pyarrow) and a
#                        Java 17 runtime; Compaction drivers and Spark executor pods
#   1. a Debian bookworm base (python3, venv, CA certificates; the Spark image's adds
#      openjdk-17-jre-headless) made by mmdebstrap, cached in ~/.cache/headrace/image/
#      and imported as localhost/headrace-base:bookworm (bookworm-spark);
#   2. wheels of headrace and its dependencies (pip on this host) in build/image/wheels
#      (wheels-spark);
#   3. `buildah bud`, tagged localhost/headrace:VERSION (localhost/headrace-spark:VERSION);
#   4. its entry points inside a container of it.
# With REF=<commit> the wheels are those of that commit of this repository (exported with
# `git archive`, e.g. the previous release a rolling-upgrade test starts from), the
# recipe (this Containerfile) today's, and the tag localhost/headrace:git-<sha12>; an
# image of that tag already in buildah's store is kept (a commit's code never changes).
# Without REF the build is keyed on a hash of its inputs (the packages' files as the wheel
# takes them, pyproject.toml, hatch_build.py, README.md, the Containerfile, this script, the base and the
# host's Python): the image is also tagged localhost/headrace:src-<hash16>, and when that
# tag exists the build is skipped and IMAGE is pointed at it. The image's
# content-addressed reference is written to build/image/ref (spark-ref for the Spark
# image; what `make test` and `make e2e-node` run; a REF build leaves it alone).
# Needs root (or rootless buildah with subuids), buildah and mmdebstrap:
#   apt-get install -y buildah mmdebstrap
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
CACHE=${HEADRACE_CACHE:-$HOME/.cache/headrace}/image
SUITE=bookworm
TARGET=${1:-headrace}
case "$TARGET" in
  headrace)
    FLAVOUR=$SUITE
    PACKAGES=python3,python3-venv,ca-certificates
    NAME=localhost/headrace
    CONTAINERFILE=Containerfile
    EXTRAS=broker,operator,tiered,compression
    WHEELS=build/image/wheels
    REF_FILE=build/image/ref
    RECIPE=(Containerfile)
    ;;
  spark)
    FLAVOUR=$SUITE-spark
    PACKAGES=python3,python3-venv,ca-certificates,openjdk-17-jre-headless
    NAME=localhost/headrace-spark
    CONTAINERFILE=Containerfile.spark
    EXTRAS=broker,tiered,compression,jobs
    WHEELS=build/image/wheels-spark
    REF_FILE=build/image/spark-ref
    RECIPE=(Containerfile.spark tools/image/spark-entrypoint.sh)
    ;;
  *)
    echo "usage: $0 [headrace|spark]" >&2
    exit 2
    ;;
esac
BASE_TAR=$CACHE/base-$FLAVOUR.tar
BASE=localhost/headrace-base:$FLAVOUR
# vfs: works without overlay or fuse inside an unprivileged container (slower, fine here)
export STORAGE_DRIVER=${STORAGE_DRIVER:-vfs}
BUILDAH=(buildah --storage-driver "$STORAGE_DRIVER")
SRC=.
if [ -n "${REF:-}" ]; then
  SHA=$(git rev-parse --verify "$REF^{commit}")
  IMAGE=${IMAGE:-$NAME:git-${SHA:0:12}}
  if "${BUILDAH[@]}" inspect --type image "$IMAGE" >/dev/null 2>&1; then
    echo "$IMAGE"
    exit 0
  fi
  SRC=build/image/src-$SHA
  rm -rf "$SRC" && mkdir -p "$SRC"
  git archive --format=tar "$SHA" | tar -x -C "$SRC"
else
  VERSION=$($PY -c 'import importlib.metadata as m; print(m.version("headrace"))')
  IMAGE=${IMAGE:-$NAME:$VERSION}
fi

mkdir -p "$CACHE" build/image
if [ ! -s "$BASE_TAR" ]; then
  mmdebstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$BASE_TAR.tmp"
  mv "$BASE_TAR.tmp" "$BASE_TAR"
fi

# inputs_hash: what the image is made of, here. Tracked and untracked-but-not-ignored files
# are what hatchling puts in the wheel; a deleted tracked file is left out, as it is there.
inputs_hash() {
  {
    git ls-files -z -c -o --exclude-standard -- broker/headrace operator/headrace \
      pyproject.toml hatch_build.py README.md "${RECIPE[@]}" tools/image/build.sh |
      sort -z | while IFS= read -r -d '' f; do
        [ -f "$f" ] && printf '%s %s\n' "$(sha256sum <"$f" | cut -c1-64)" "$f"
      done
    stat -c 'base %s %Y' "$BASE_TAR"
    $PY --version
  } | sha256sum | cut -c1-16
}
if [ "$SRC" = . ]; then
  SOURCE_IMAGE=$NAME:src-$(inputs_hash)
  if "${BUILDAH[@]}" inspect --type image "$SOURCE_IMAGE" >/dev/null 2>&1; then
    [ "$IMAGE" = "$SOURCE_IMAGE" ] || "${BUILDAH[@]}" tag "$SOURCE_IMAGE" "$IMAGE"
    echo "$SOURCE_IMAGE" >"$REF_FILE"
    echo "image inputs unchanged: $SOURCE_IMAGE (tagged $IMAGE), not rebuilt" >&2
    echo "$IMAGE"
    exit 0
  fi
fi
if ! "${BUILDAH[@]}" inspect --type image "$BASE" >/dev/null 2>&1; then
  ctr=$("${BUILDAH[@]}" from scratch)
  "${BUILDAH[@]}" add "$ctr" "$BASE_TAR" /
  "${BUILDAH[@]}" config --cmd /bin/sh "$ctr"
  "${BUILDAH[@]}" commit --rm "$ctr" "$BASE"
fi

rm -rf "$WHEELS"
$PY -m pip wheel -q --wheel-dir "$WHEELS" "$SRC[$EXTRAS]"
[ "$SRC" = . ] || rm -rf "$SRC"

# no --layers: on vfs every step's image is a full copy of the root (0.5 GB for the
# headrace image, 1.3 GB for the Spark one), and the build is skipped as a whole when
# its inputs are unchanged anyway
"${BUILDAH[@]}" bud --isolation chroot -f "$CONTAINERFILE" --build-arg "BASE=$BASE" -t "$IMAGE" .

ctr=$("${BUILDAH[@]}" from "$IMAGE")
trap '"${BUILDAH[@]}" rm "$ctr" >/dev/null' EXIT
run_in() { "${BUILDAH[@]}" run --isolation chroot "$ctr" -- "$@"; }
run_in headrace --version
# as the image's user, which has a name (kopf's peer identity is getpass.getuser())
run_in python -c 'import getpass; getpass.getuser()'
if [ "$TARGET" = headrace ]; then
  run_in python -c 'import headrace.broker, headrace.operator.main'
  # the compiled Kafka record-section check the produce path needs (built into the wheel)
  run_in python -c 'import headrace.records._kafka_check'
  # both entry points answer: the brokers' `headrace broker` and the operator's module
  run_in headrace broker --help >/dev/null
  run_in python -m headrace.operator --help >/dev/null
else
  # the driver's side: `headrace compact` with pyspark, pyarrow and the JVM it starts
  run_in headrace compact --help >/dev/null
  run_in python -c 'import pyspark, pyarrow, headrace.jobs.compact'
  run_in java -version
  # the executors' side: Spark's executor class on SPARK_HOME's jars, and the entrypoint
  # refusing an executor without the driver's environment
  run_in sh -c 'ls "$SPARK_HOME"/jars/spark-kubernetes_*.jar >/dev/null'
  if out=$(run_in /opt/entrypoint.sh executor 2>&1); then
    echo "the entrypoint started an executor without SPARK_DRIVER_URL: $out" >&2
    exit 1
  fi
  grep -q 'SPARK_DRIVER_URL is not set' <<<"$out"
fi
# tagged by its inputs only once every check passed: a later build trusts that tag
if [ "$SRC" = . ]; then
  "${BUILDAH[@]}" tag "$IMAGE" "$SOURCE_IMAGE"
  echo "$SOURCE_IMAGE" >"$REF_FILE"
fi
echo "$IMAGE"
