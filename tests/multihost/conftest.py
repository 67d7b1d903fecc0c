"""The S3-compatible server of infra/s3 for the tests of several hosts' worth of processes:
started once per session (``object_store_env``), one fresh ``s3://`` prefix per test."""

from __future__ import annotations

import uuid
from contextlib import contextmanager

import pytest

from tests.conftest import unavailable
from tests.servers import ServerStartError, environment
from tests.servers import s3_server as started_s3_server


@contextmanager
def s3_server(tmp_path):
    """(endpoint, access key, secret) of a server of our own on free ports; stopped by pid."""
    try:
        with started_s3_server(tmp_path / "s3") as env:
            yield env["AWS_ENDPOINT_URL"], env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]
    except ServerStartError as err:
        unavailable(str(err))


@pytest.fixture(scope="session")
def object_store_env(tmp_path_factory):
    """The ``AWS_*`` variables of a session-wide S3 server, also set in ``os.environ`` (so
    child processes inherit them) for the session and restored after."""
    with s3_server(tmp_path_factory.mktemp("s3")) as (endpoint, key, secret):
        with environment({"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": key,
                          "AWS_SECRET_ACCESS_KEY": secret, "AWS_REGION": "us-east-1"}) as env:
            from pipeline.storage import ObjectStore

            ObjectStore("s3://rankstream").ensure_bucket()
            yield env


@pytest.fixture
def store_url(object_store_env):
    """A fresh ``s3://rankstream/<test>`` prefix on the session's server."""
    return f"s3://rankstream/t-{uuid.uuid4().hex[:12]}"
