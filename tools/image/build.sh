#!/usr/bin/env bash
# Build the headrace image with buildah (no Docker engine needed) and check that it
# runs `headrace --version`.
#   1. a Debian bookworm base (python3, venv, CA certificates) made by mmdebstrap,
#      cached in ~/.cache/headrace/image/ and imported as localhost/headrace-base:bookworm;
#   2. wheels of headrace and its dependencies (pip on this host) in build/image/wheels;
#   3. `buildah bud -f Containerfile`, tagged localhost/headrace:VERSION;
#   4. `headrace --version` inside a container of it.
# With REF=<commit> the wheels are those of that commit of this repository (exported with
# `git archive`, e.g. the previous release a rolling-upgrade test starts from), the
# recipe (this Containerfile) today's, and the tag localhost/headrace:git-<sha12>; an
# image of that tag already in buildah's store is kept (a commit's code never changes).
# Without REF the build is keyed on a hash of its inputs (the packages' files as the wheel
# takes them, pyproject.toml, README.md, the Containerfile, this script, the base and the
# host's Python): the image is also tagged localhost/headrace:src-<hash16>, and when that
# tag exists the build is skipped and IMAGE is pointed at it. The image's
# content-addressed reference is written to build/image/ref (what `make test` runs; a
# REF build leaves it alone).
# Needs root (or rootless buildah with subuids), buildah and mmdebstrap:
#   apt-get install -y buildah mmdebstrap
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
CACHE=${HEADRACE_CACHE:-$HOME/.cache/headrace}/image
SUITE=bookworm
BASE_TAR=$CACHE/base-$SUITE.tar
BASE=localhost/headrace-base:$SUITE
# vfs: works without overlay or fuse inside an unprivileged container (slower, fine here)
export STORAGE_DRIVER=${STORAGE_DRIVER:-vfs}
BUILDAH=(buildah --storage-driver "$STORAGE_DRIVER")
SRC=.
if [ -n "${REF:-}" ]; then
  SHA=$(git rev-parse --verify "$REF^{commit}")
  IMAGE=${IMAGE:-localhost/headrace:git-${SHA:0:12}}
  if "${BUILDAH[@]}" inspect --type image "$IMAGE" >/dev/null 2>&1; then
    echo "$IMAGE"
    exit 0
  fi
  SRC=build/image/src-$SHA
  rm -rf "$SRC" && mkdir -p "$SRC"
  git archive --format=tar "$SHA" | tar -x -C "$SRC"
else
  VERSION=$($PY -c 'import importlib.metadata as m; print(m.version("headrace"))')
  IMAGE=${IMAGE:-localhost/headrace:$VERSION}
fi

mkdir -p "$CACHE" build/image
if [ ! -s "$BASE_TAR" ]; then
  mmdebstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    "$SUITE" "$BASE_TAR.tmp"
  mv "$BASE_TAR.tmp" "$BASE_TAR"
fi

# inputs_hash: what the image is made of, here. Tracked and untracked-but-not-ignored files
# are what hatchling puts in the wheel; a deleted tracked file is left out, as it is there.
inputs_hash() {
  {
    git ls-files -z -c -o --exclude-standard -- broker/headrace operator/headrace \
      pyproject.toml README.md Containerfile tools/image/build.sh |
      sort -z | while IFS= read -r -d '' f; do
        [ -f "$f" ] && printf '%s %s\n' "$(sha256sum <"$f" | cut -c1-64)" "$f"
      done
    stat -c 'base %s %Y' "$BASE_TAR"
    $PY --version
  } | sha256sum | cut -c1-16
}
if [ "$SRC" = . ]; then
  SOURCE_IMAGE=localhost/headrace:src-$(inputs_hash)
  if "${BUILDAH[@]}" inspect --type image "$SOURCE_IMAGE" >/dev/null 2>&1; then
    [ "$IMAGE" = "$SOURCE_IMAGE" ] || "${BUILDAH[@]}" tag "$SOURCE_IMAGE" "$IMAGE"
    echo "$SOURCE_IMAGE" >build/image/ref
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

rm -rf build/image/wheels
$PY -m pip wheel -q --wheel-dir build/image/wheels "$SRC[broker,operator,tiered,compression]"
[ "$SRC" = . ] || rm -rf "$SRC"

"${BUILDAH[@]}" bud --isolation chroot --layers -f Containerfile --build-arg "BASE=$BASE" -t "$IMAGE" .

ctr=$("${BUILDAH[@]}" from "$IMAGE")
trap '"${BUILDAH[@]}" rm "$ctr" >/dev/null' EXIT
"${BUILDAH[@]}" run --isolation chroot "$ctr" -- headrace --version
"${BUILDAH[@]}" run --isolation chroot "$ctr" -- python -c 'import headrace.broker, headrace.operator.main'
# both entry points answer: the brokers' `headrace broker` and the operator's module
"${BUILDAH[@]}" run --isolation chroot "$ctr" -- headrace broker --help >/dev/null
"${BUILDAH[@]}" run --isolation chroot "$ctr" -- python -m headrace.operator --help >/dev/null
# as the image's user, which has a name (kopf's peer identity is getpass.getuser())
"${BUILDAH[@]}" run --isolation chroot "$ctr" -- python -c 'import getpass; getpass.getuser()'
# tagged by its inputs only once every check passed: a later build trusts that tag
if [ "$SRC" = . ]; then
  "${BUILDAH[@]}" tag "$IMAGE" "$SOURCE_IMAGE"
  echo "$SOURCE_IMAGE" >build/image/ref
fi
echo "$IMAGE"
