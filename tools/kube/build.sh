#!/bin/sh
# Builds the Kubernetes test binaries (kube-apiserver, etcd, kwok) the kube
# driver's tests start on 127.0.0.1, from the Go module proxy, pinned by this
# directory's go.mod files, and copies kwok's "fast" node and Pod stages
# (kwok-stages.yaml: nodes Ready, Pods Running with an IP at once, deleted
# Pods removed) from the pinned kwok module. They are cached by version under
# $CORRAL_KUBE_CACHE (default /var/cache/corral/kube)/<VERSION>/ outside the
# repository and built at most once: a run that finds all three binaries
# does nothing. Concurrent runs serialise on a lock file in the cache.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
version=$(cat "$here/VERSION")
cache=${CORRAL_KUBE_CACHE:-/var/cache/corral/kube}
dir="$cache/$version"
GO=${GO:-go}

have() { [ -x "$dir/kube-apiserver" ] && [ -x "$dir/etcd" ] && [ -x "$dir/kwok" ] && [ -f "$dir/kwok-stages.yaml" ]; }
have && exit 0

# VERSION must name what go.mod pins, so the cache key cannot go stale.
k8s=$(cd "$here" && $GO list -m -f '{{.Version}}' k8s.io/kubernetes)
etcd=$(cd "$here" && $GO list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
kwok=$(cd "$here/kwok" && $GO list -m -f '{{.Version}}' sigs.k8s.io/kwok)
want="k8s-${k8s}_etcd-${etcd}_kwok-${kwok}"
if [ "$want" != "$version" ]; then
	echo "tools/kube/VERSION says $version but go.mod pins $want" >&2
	exit 1
fi

mkdir -p "$cache"
exec 9>"$cache/.build.lock"
flock 9
have && exit 0
tmp=$(mktemp -d "$cache/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$dir"
export CGO_ENABLED=0
start=$(date +%s)
# Each artefact is built only when missing, then moved into place whole.
if [ ! -x "$dir/etcd" ]; then
	echo "building etcd $etcd into $dir" >&2
	(cd "$here" && nice -n 10 $GO build -trimpath -o "$tmp/etcd" go.etcd.io/etcd/server/v3)
	mv "$tmp/etcd" "$dir/etcd"
fi
if [ ! -x "$dir/kwok" ]; then
	echo "building kwok $kwok into $dir" >&2
	(cd "$here/kwok" && nice -n 10 $GO build -trimpath -o "$tmp/kwok" sigs.k8s.io/kwok/cmd/kwok)
	mv "$tmp/kwok" "$dir/kwok"
fi
if [ ! -f "$dir/kwok-stages.yaml" ]; then
	src=$(cd "$here/kwok" && $GO mod download -json sigs.k8s.io/kwok | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')/kustomize/stage
	for f in node/fast/node-initialize.yaml node/heartbeat/node-heartbeat.yaml pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
		cat "$src/$f"
		echo "---"
	done > "$tmp/kwok-stages.yaml"
	mv "$tmp/kwok-stages.yaml" "$dir/kwok-stages.yaml"
fi
if [ ! -x "$dir/kube-apiserver" ]; then
	echo "building kube-apiserver $k8s into $dir (slow: about 15 min on 2 cores, once)" >&2
	v=${k8s#v}
	(cd "$here" && nice -n 10 $GO build -trimpath \
		-ldflags "-X k8s.io/component-base/version.gitVersion=$k8s -X k8s.io/component-base/version.gitMajor=${v%%.*} -X k8s.io/component-base/version.gitMinor=$(echo "$v" | cut -d. -f2)" \
		-o "$tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver)
	mv "$tmp/kube-apiserver" "$dir/kube-apiserver"
fi
echo "kube test binaries ready in $(( $(date +%s) - start )) s: $dir" >&2
