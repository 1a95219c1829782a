#!/bin/sh
# Builds the Kubernetes test binaries (kube-apiserver, etcd, kwok) the kube
# driver's tests start on 127.0.0.1, from the Go module proxy, pinned by this
# directory's go.mod files. They are cached by version under
# $CORRAL_KUBE_CACHE (default /var/cache/corral/kube)/<VERSION>/ outside the
# repository and built at most once: a run that finds all three binaries
# does nothing. Concurrent runs serialise on a lock file in the cache.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
version=$(cat "$here/VERSION")
cache=${CORRAL_KUBE_CACHE:-/var/cache/corral/kube}
dir="$cache/$version"
GO=${GO:-go}

have() { [ -x "$dir/kube-apiserver" ] && [ -x "$dir/etcd" ] && [ -x "$dir/kwok" ]; }
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
export CGO_ENABLED=0
start=$(date +%s)
echo "building etcd $etcd into $dir" >&2
(cd "$here" && nice -n 10 $GO build -trimpath -o "$tmp/etcd" go.etcd.io/etcd/server/v3)
echo "building kwok $kwok into $dir" >&2
(cd "$here/kwok" && nice -n 10 $GO build -trimpath -o "$tmp/kwok" sigs.k8s.io/kwok/cmd/kwok)
echo "building kube-apiserver $k8s into $dir (slow: about 15 min on 2 cores, once)" >&2
v=${k8s#v}
(cd "$here" && nice -n 10 $GO build -trimpath \
	-ldflags "-X k8s.io/component-base/version.gitVersion=$k8s -X k8s.io/component-base/version.gitMajor=${v%%.*} -X k8s.io/component-base/version.gitMinor=$(echo "$v" | cut -d. -f2)" \
	-o "$tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver)
mkdir -p "$dir"
for b in etcd kwok kube-apiserver; do mv "$tmp/$b" "$dir/$b"; done
echo "kube test binaries built in $(( $(date +%s) - start )) s: $dir" >&2
