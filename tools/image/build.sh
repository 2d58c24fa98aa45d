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

mkdir -p "$CACHE"
if [ ! -s "$BASE_TAR" ]; then
  mmdebstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    "$SUITE" "$BASE_TAR.tmp"
  mv "$BASE_TAR.tmp" "$BASE_TAR"
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
echo "$IMAGE"
