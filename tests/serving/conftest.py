"""A private redis-server (or Redis Cluster) per test (through infra/redis) for tests that
stop, pause, kill, restart or reconfigure it."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from tests.conftest import unavailable
from tests.servers import INFRA, infra_server, redis_cluster


class OwnRedis:
    """A redis-server of our own: ``url``, ``stop()``, ``start()`` (same port), ``pause()`` /
    ``resume()`` (SIGSTOP/SIGCONT of its pid, to make it slow rather than down)."""

    def __init__(self, port: int, directory):
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"
        self.dir = directory
        self.env = {**os.environ, "RANKSTREAM_REDIS_PORT": str(port),
                    "RANKSTREAM_REDIS_DIR": str(directory)}

    @property
    def pid(self) -> int:
        return int((self.dir / "redis.pid").read_text())

    def stop(self) -> None:
        subprocess.run([INFRA / "redis" / "stop.sh"], env=self.env, check=True,
                       capture_output=True, timeout=60)

    def start(self) -> None:
        subprocess.run([INFRA / "redis" / "start.sh"], env=self.env, check=True,
                       capture_output=True, timeout=60)

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)


@pytest.fixture
def own_redis(tmp_path):
    """A fresh redis-server for this test only (marked ``redis``)."""
    try:
        with infra_server("redis", tmp_path) as port:
            server = OwnRedis(port, tmp_path / "redis")
            try:
                yield server
            finally:
                try:
                    server.resume()
                except (OSError, ValueError):
                    pass
    except RuntimeError as err:
        unavailable(str(err))


class OwnCluster:
    """A 6-node Redis Cluster of our own: ``url`` (its first node), ``ports``, ``pid(port)``,
    ``kill(port)`` (SIGKILL by the pid in the node's pid file, after checking that the pid is
    the redis-server of that port)."""

    def __init__(self, base: int, directory):
        self.base, self.dir = base, directory
        self.ports = list(range(base, base + 6))
        self.url = f"redis://127.0.0.1:{base}/0"

    def pid(self, port: int) -> int:
        return int((self.dir / str(port) / "redis.pid").read_text())

    def kill(self, port: int) -> int:
        pid = self.pid(port)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode()
        if "redis-server" not in cmdline or f":{port}" not in cmdline:
            raise RuntimeError(f"pid {pid} of node {port} is {cmdline!r}, not its redis-server")
        os.kill(pid, signal.SIGKILL)
        return pid


@pytest.fixture
def own_cluster(tmp_path):
    """A fresh 6-node Redis Cluster for this test only (marked ``redis``)."""
    try:
        with redis_cluster(tmp_path) as (base, directory):
            yield OwnCluster(base, directory)
    except RuntimeError as err:
        unavailable(str(err))


def pytest_collection_modifyitems(items):
    for item in items:
        if {"own_redis", "own_cluster"} & set(getattr(item, "fixturenames", ())):
            item.add_marker("redis")
