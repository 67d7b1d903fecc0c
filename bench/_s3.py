"""The S3-compatible server of ``infra/s3`` for a bench run: started on free loopback ports with
its state under the user's state directory, its ``AWS_*`` variables set in ``os.environ`` (child
processes inherit them), stopped by its pid at the end."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def s3_server(bucket: str = "bench"):
    """Yield an ``s3://bucket`` URL on a server of this run's own (an existing server is used
    instead when ``AWS_ENDPOINT_URL`` is set)."""
    from pipeline.settings import state_dir
    from pipeline.storage import ObjectStore

    if os.environ.get("AWS_ENDPOINT_URL"):
        ObjectStore(f"s3://{bucket}").ensure_bucket()
        yield f"s3://{bucket}"
        return
    from tests.servers import environment
    from tests.servers import s3_server as started_s3_server

    state = Path(tempfile.mkdtemp(prefix="bench-s3-", dir=state_dir("bench")))
    print("starting an S3 server (infra/s3/start.sh) ...", flush=True)
    try:
        with started_s3_server(state) as env, environment(env):
            ObjectStore(f"s3://{bucket}").ensure_bucket()
            yield f"s3://{bucket}"
    finally:
        shutil.rmtree(state, ignore_errors=True)
        print("S3 server stopped", flush=True)
