#!/usr/bin/env bash
# Copy the broker's jars from Maven Central into $1 (once; a marker file records the pom's hash).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
libs=${1:-${RANKSTREAM_KAFKA_LIBS:-$HOME/.cache/rankstream/kafka-libs}}
stamp=$(sha256sum "$here/pom.xml" | cut -c1-16)
if [[ -f $libs/.pom-$stamp ]]; then exit 0; fi
rm -rf "$libs"
mkdir -p "$libs"
mvn -q -B -Dstyle.color=never -f "$here/pom.xml" dependency:copy-dependencies -DoutputDirectory="$libs"
touch "$libs/.pom-$stamp"
echo "kafka jars in $libs"
