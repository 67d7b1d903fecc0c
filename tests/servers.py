"""Start and stop the real servers of ``infra/`` for the test session, by process id."""

from __future__ import annotations

import os
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


@contextmanager
def infra_server(name: str, tmp: Path):
    """Run ``infra/NAME/start.sh`` on a free port with its state under ``tmp``; yield the port;
    run ``infra/NAME/stop.sh`` (which stops the process by its pid) afterwards."""
    port = free_port(pair=(name == "kafka"))
    prefix = f"RANKSTREAM_{name.upper()}"
    env = {**os.environ, f"{prefix}_PORT": str(port), f"{prefix}_DIR": str(tmp / name)}
    start = subprocess.run([INFRA / name / "start.sh"], env=env, capture_output=True, text=True,
                           timeout=300)
    if start.returncode != 0:
        raise RuntimeError(f"infra/{name}/start.sh failed ({start.returncode}):\n"
                           f"{start.stdout}\n{start.stderr}")
    try:
        yield port
    finally:
        subprocess.run([INFRA / name / "stop.sh"], env=env, capture_output=True, timeout=60)
