"""Start and stop the real servers of ``infra/`` for the test session, by process id."""

from __future__ import annotations

import os
import random
import socket
import subprocess
from contextlib import contextmanager
from pathlib import Path

INFRA = Path(__file__).resolve().parent.parent / "infra"


def free_port(pair: bool = False) -> int:
    """A free loopback port (and port+1 too, when ``pair``: Kafka's controller uses it)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not pair or port >= 65535:
            return port
        with socket.socket() as s2:
            try:
                s2.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue
    raise RuntimeError("no free loopback port pair found")


class ServerStartError(RuntimeError):
    """A server of infra/ did not start."""


@contextmanager
def started(start: str, stop: str, env: dict, timeout: int = 300):
    """Run ``infra/START`` with ``env`` (a failure: :class:`ServerStartError` with its
    output), yield, then run ``infra/STOP``, which stops what it started by process id."""
    run = subprocess.run([INFRA / start], env=env, capture_output=True, text=True,
                         timeout=timeout)
    try:
        if run.returncode != 0:
            raise ServerStartError(f"infra/{start} failed ({run.returncode}):\n{run.stdout}\n"
                                   f"{run.stderr.strip()[-2000:]}")
        yield
    finally:
        subprocess.run([INFRA / stop], env=env, capture_output=True, timeout=120)


@contextmanager
def infra_server(name: str, tmp: Path):
    """Run ``infra/NAME/start.sh`` on a free port with its state under ``tmp``; yield the port;
    run ``infra/NAME/stop.sh`` (which stops the process by its pid) afterwards."""
    port = free_port(pair=(name == "kafka"))
    prefix = f"RANKSTREAM_{name.upper()}"
    env = {**os.environ, f"{prefix}_PORT": str(port), f"{prefix}_DIR": str(tmp / name)}
    with started(f"{name}/start.sh", f"{name}/stop.sh", env):
        yield port


def _ephemeral_low() -> int:
    """The first port of the kernel's range for outgoing connections."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port_block(n: int, offset: int = 10000, low: int = 10000) -> int:
    """A base port with ``base .. base+n-1`` and each ``+ offset`` free on loopback (a Redis
    Cluster node listens on its port and its bus port, port + 10000; ``offset=0``: the block
    alone). The ports lie below the kernel's range for outgoing connections: a server that
    starts after its peers must not find its port taken by one of their outgoing sockets (a
    Kafka controller port was, once); ``low``: the lowest base."""
    rng = random.Random()
    high = _ephemeral_low() - offset - n
    for _ in range(200):
        base = rng.randrange(low, max(high, low + 1))
        socks = []
        try:
            extra = range(base + offset, base + offset + n) if offset else ()
            for port in [*range(base, base + n), *extra]:
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no block of {n} free loopback ports (and their +{offset}) found")


@contextmanager
def redis_cluster(tmp: Path):
    """Run ``infra/redis/cluster-start.sh`` (6 nodes: 3 primaries, 3 replicas) on free ports
    with its state under ``tmp``; yield ``(base port, state dir)``; run ``cluster-stop.sh``
    (each node stopped by its pid) afterwards."""
    base = free_port_block(6)
    env = {**os.environ, "RANKSTREAM_REDIS_CLUSTER_PORT": str(base),
           "RANKSTREAM_REDIS_CLUSTER_DIR": str(tmp / "redis-cluster")}
    with started("redis/cluster-start.sh", "redis/cluster-stop.sh", env):
        yield base, tmp / "redis-cluster"


@contextmanager
def s3_server(state: Path):
    """The ``AWS_*`` variables of infra/s3's server, started on free loopback ports with its
    state in ``state``; stopped by its pid after. :class:`ServerStartError` if it does not
    start."""
    port = free_port_block(4, offset=10000)
    env = {**os.environ, "RANKSTREAM_S3_PORT": str(port), "RANKSTREAM_S3_DIR": str(state)}
    with started("s3/start.sh", "s3/stop.sh", env, timeout=900):
        creds = dict(line.split("=", 1) for line in
                     (state / "credentials.env").read_text().split())
        yield {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_REGION": "us-east-1",
               "AWS_ACCESS_KEY_ID": creds["AWS_ACCESS_KEY_ID"],
               "AWS_SECRET_ACCESS_KEY": creds["AWS_SECRET_ACCESS_KEY"]}


@contextmanager
def environment(values: dict):
    """``os.environ`` with ``values`` set within the block (child processes inherit them),
    as it was after."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield values
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def ray_cluster(tmp: Path, workers: int = 2):
    """``infra/ray/start.sh`` with ``workers`` one-CPU worker nodes on a free block of
    loopback ports (the head's GCS, its client server and one agent port per node), state and
    Ray's session files under ``tmp``; yield the head's port; ``infra/ray/stop.sh`` after."""
    port = free_port_block(workers + 3, offset=0, low=20000)   # Ray's workers take 10002-19999
    env = {**os.environ, "RANKSTREAM_RAY_PORT": str(port), "RANKSTREAM_RAY_DIR": str(tmp),
           "RANKSTREAM_RAY_WORKERS": str(workers), "RANKSTREAM_RAY_SESSION_DIR": str(tmp / "s"),
           "RANKSTREAM_RAY_WORKER_MEMORY": "1500000000"}
    with started("ray/start.sh", "ray/stop.sh", env):
        yield port
