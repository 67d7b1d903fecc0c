#!/usr/bin/env bash
# Build SeaweedFS's `weed` (a real S3-compatible server: `weed server -s3`) from its Go module on
# the module proxy, once per pinned version: the binary is cached as
# ~/.cache/rankstream/s3/weed-$VERSION (like the Kafka jars). SeaweedFS's go.mod has replace
# directives, so `go install module@version` refuses it; it is built as the main module of a
# copy of its source instead. Prints the binary's path.
#
#   RANKSTREAM_S3_CACHE   where the source copy and the binary go (default ~/.cache/rankstream/s3)
set -euo pipefail
version=v0.0.0-20261109003541-7506e5f91cd6
module=github.com/seaweedfs/seaweedfs
cache=${RANKSTREAM_S3_CACHE:-$HOME/.cache/rankstream/s3}
binary=$cache/weed-$version
if [[ -x $binary ]]; then echo "$binary"; exit 0; fi
command -v go >/dev/null || { echo "go is not installed: the S3 server is built from source" >&2; exit 1; }
mkdir -p "$cache"
started=$(date +%s)
src=$(go mod download -json "$module@$version" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
work=$cache/src-$version
rm -rf "$work" && cp -r "$src" "$work" && chmod -R u+w "$work"
(cd "$work" && go build -o "$binary.partial" ./weed)
mv "$binary.partial" "$binary"
rm -rf "$work"
echo "[s3] built weed $version in $(( $(date +%s) - started )) s" >&2
echo "$binary"
