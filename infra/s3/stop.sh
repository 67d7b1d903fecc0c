#!/usr/bin/env bash
# Stop the S3 server started by start.sh for this port, by its process id; idempotent.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/state.sh"
port=${RANKSTREAM_S3_PORT:-8333}
dir=${RANKSTREAM_S3_DIR:-$(rs_state_dir "s3-$port")}
exec "$here/stop_pid.sh" s3 "$dir/weed.pid" 20 "weed-[^ ]* .*server .*-s3.port=$port "
