#!/usr/bin/env bash
# A real node's runtime pieces for the test bed; idempotent. build.sh runs it with
# TESTBED_NODE=1 (after building the kubelet and kube-proxy); by hand:
#
#   e2e/testbed/node/build.sh IMAGES_DIR
#
# - containerd, runc, the CNI plugins, iptables, conntrack and buildah are Debian's
#   packages: installed with apt-get when missing (as root), else it says what to install.
# - two images, built here from source and saved as docker-archive tars in IMAGES_DIR,
#   which the node imports into containerd (nothing is ever pulled):
#     localhost/testbed-pause:1     the pod sandbox (pause.c, static)
#     localhost/testbed-busybox:1   Debian's static busybox with its applet links
#     localhost/testbed-coredns:1   the cluster DNS: CoreDNS (COREDNS_BIN, which build.sh
#                                   builds from its Go module) alone
# An image is rebuilt only when its stamp (hash of its inputs) changed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
images=${1:?usage: $0 IMAGES_DIR}
nice=${TESTBED_NICE:-10}

packages=(containerd runc containernetworking-plugins iptables conntrack buildah busybox-static)
missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
	if [[ $(id -u) -ne 0 ]]; then
		echo "a real node needs Debian's ${missing[*]}: apt-get install -y ${missing[*]}" >&2
		exit 1
	fi
	echo "installing ${missing[*]} (apt-get)" >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2
fi

# vfs: the storage driver tools/image/build.sh uses too (no overlay-on-overlay questions)
export STORAGE_DRIVER=${STORAGE_DRIVER:-vfs}
buildah=(buildah --storage-driver "$STORAGE_DRIVER")
mkdir -p "$images"
exec 9>"$images/.build.lock"
flock 9

# image NAME REF STAMP_INPUT... -- then the function "fill_NAME ROOTFS" populates the rootfs
image() {
	local name=$1 ref=$2
	shift 2
	local stamp
	stamp=$(cat "$@" | sha256sum | cut -c1-16)
	if [[ -s $images/$name.tar && $(cat "$images/.$name.stamp" 2>/dev/null) == "$stamp" ]]; then
		return
	fi
	local start tmp ctr
	start=$(date +%s)
	tmp=$(mktemp -d)
	mkdir "$tmp/rootfs"
	"fill_$name" "$tmp/rootfs"
	ctr=$("${buildah[@]}" from scratch)
	"${buildah[@]}" copy "$ctr" "$tmp/rootfs/" / >/dev/null
	"config_$name" "$ctr"
	"${buildah[@]}" commit --rm -q "$ctr" "$ref" >/dev/null
	rm -f "$images/$name.tar.tmp"
	"${buildah[@]}" push -q "$ref" "docker-archive:$images/$name.tar.tmp:$ref"
	mv -f "$images/$name.tar.tmp" "$images/$name.tar"
	rm -rf "$tmp"
	echo "$stamp" >"$images/.$name.stamp"
	echo "built image $ref in $(($(date +%s) - start)) s" >&2
}

fill_pause() {
	nice -n "$nice" gcc -static -Os -s -Wall -Wextra -Werror -o "$1/pause" "$here/pause.c"
}
config_pause() {
	# 65535: the uid Kubernetes' own pause image runs as
	"${buildah[@]}" config --entrypoint '["/pause"]' --cmd '' --user 65535:65535 "$1"
}

fill_busybox() {
	mkdir -p "$1/bin" "$1/tmp" "$1/etc"
	cp /bin/busybox "$1/bin/busybox"
	local applet
	for applet in $(/bin/busybox --list); do
		[[ $applet == busybox ]] || ln -s busybox "$1/bin/$applet"
	done
	chmod 1777 "$1/tmp"
	printf 'root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$1/etc/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' >"$1/etc/group"
}
config_busybox() {
	"${buildah[@]}" config --entrypoint '[]' --cmd '["/bin/sh"]' --env PATH=/bin "$1"
}

image pause localhost/testbed-pause:1 "$here/pause.c" "$here/build.sh" <(gcc --version)
image busybox localhost/testbed-busybox:1 /bin/busybox "$here/build.sh"

fill_coredns() {
	cp "${COREDNS_BIN:?COREDNS_BIN: the coredns binary build.sh built}" "$1/coredns"
}
config_coredns() {
	# an unprivileged uid (it listens above 1024; the Service maps port 53 to it)
	"${buildah[@]}" config --entrypoint '["/coredns"]' --cmd '' --user 65532:65532 "$1"
}

image coredns localhost/testbed-coredns:1 "$COREDNS_BIN" "$here/build.sh"
