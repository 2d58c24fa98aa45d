#!/usr/bin/env bash
# Build the test bed's upstream binaries from their Go modules; idempotent.
#
#   e2e/testbed/build.sh            build what is missing, print the bin directory
#   e2e/testbed/build.sh --bin-dir  print the bin directory only
#   TESTBED_NODE=1 e2e/testbed/build.sh   also a real node (E2E_NODE=real): the kubelet and
#                                   kube-proxy, CoreDNS, Debian's containerd, runc and CNI plugins,
#                                   and the pause, busybox and CoreDNS images (node/build.sh, into
#                                   <bin>/../images)
#
# Binaries go to ${TESTBED_BIN:-${HEADRACE_CACHE:-$HOME/.cache/headrace}/testbed/<k8s-version>/bin},
# outside the repository. A group (kube, etcd, helm) is rebuilt only when a binary is missing
# or its stamp (hash of the wrapper module and flags) changed; the ordinary Go build and
# module caches make a rebuild after `rm -rf ~/.cache/headrace` a matter of linking.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"

cache=${HEADRACE_CACHE:-$HOME/.cache/headrace}
bin=${TESTBED_BIN:-$cache/testbed/$K8S_VERSION/bin}
if [[ ${1:-} == --bin-dir ]]; then
	echo "$bin"
	exit 0
fi

# The versions live in versions.env; the wrapper modules must agree with them.
check() {
	grep -qE "^\s*(require )?$2 $3( |$)" "$here/$1/go.mod" || {
		echo "e2e/testbed/$1/go.mod does not require $2 $3 (versions.env); run e2e/testbed/update-modules.sh" >&2
		exit 1
	}
}
check kube k8s.io/kubernetes "$K8S_VERSION"
check etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION"
check helm "helm.sh/helm/${HELM_VERSION%%.*}" "$HELM_VERSION"
check coredns github.com/coredns/coredns "$COREDNS_VERSION"

# Static binaries like upstream's release builds; no toolchain download; go.sum is the truth.
export CGO_ENABLED=0 GOTOOLCHAIN=local
export GOFLAGS="${GOFLAGS:-} -mod=readonly -trimpath"
nice=${TESTBED_NICE:-10}

mkdir -p "$bin"
exec 9>"$bin/.build.lock"
flock 9 # two concurrent builds (make and a test session) would only race on the same outputs

minor=${K8S_VERSION#v1.}
minor=${minor%%.*}
kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	kube_ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
	kube_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
helm_ldflags="-s -w -X helm.sh/helm/${HELM_VERSION%%.*}/internal/version.version=$HELM_VERSION"
etcd_ldflags="-s -w"

# build GROUP MODULE LDFLAGS NAME=PACKAGE...   (MODULE: the wrapper module's directory)
build() {
	local group=$1 module=$2 ldflags=$3
	shift 3
	local stamp
	stamp=$(cat "$here/$module/go.mod" "$here/$module/go.sum" <(go version) <(echo "$ldflags $GOFLAGS") | sha256sum | cut -c1-16)
	local missing=()
	local spec
	for spec in "$@"; do
		[[ -x $bin/${spec%%=*} ]] || missing+=("$spec")
	done
	if [[ ${#missing[@]} -eq 0 && $(cat "$bin/.$group.stamp" 2>/dev/null) == "$stamp" ]]; then
		return
	fi
	local tmp start
	tmp=$(mktemp -d "$bin/.tmp.XXXXXX")
	start=$(date +%s)
	echo "building $group: ${*%%=*}" >&2
	local pkgs=()
	for spec in "$@"; do pkgs+=("${spec#*=}"); done
	(cd "$here/$module" && nice -n "$nice" go build -ldflags "$ldflags" -o "$tmp/" "${pkgs[@]}")
	for spec in "$@"; do
		local name=${spec%%=*} pkg=${spec#*=}
		mv -f "$tmp/${pkg##*/}" "$bin/$name"
	done
	rmdir "$tmp"
	echo "$stamp" >"$bin/.$group.stamp"
	echo "built $group in $(($(date +%s) - start)) s" >&2
}

build etcd etcd "$etcd_ldflags" etcd=headrace.dev/testbed/etcd
build helm helm "$helm_ldflags" helm="helm.sh/helm/${HELM_VERSION%%.*}/cmd/helm"
build kube kube "$kube_ldflags" \
	kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver \
	kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager \
	kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler \
	kubectl=k8s.io/kubernetes/cmd/kubectl
# the same module and version as the control plane; static (CGO_ENABLED=0) like the rest
if [[ ${TESTBED_NODE:-0} == 1 ]]; then
	build node kube "$kube_ldflags" \
		kubelet=k8s.io/kubernetes/cmd/kubelet \
		kube-proxy=k8s.io/kubernetes/cmd/kube-proxy
	# the cluster DNS, run on the node as a pod (its image: node/build.sh)
	build coredns coredns "-s -w" coredns=headrace.dev/testbed/coredns
	COREDNS_BIN=$bin/coredns bash "$here/node/build.sh" "$(dirname "$bin")/images"
fi

echo "$bin"
