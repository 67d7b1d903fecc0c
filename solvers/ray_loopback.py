"""Keep a Ray node or driver on 127.0.0.1.

``ray start --node-ip-address=127.0.0.1`` and ``ray.init(address="127.0.0.1:PORT")`` both
replace a loopback address by the machine's routable IP (``resolve_ip_for_localhost``), so
the GCS, the raylets and the client server would listen on every interface; a node or driver
that calls :func:`keep_loopback` first keeps 127.0.0.1, so everything binds to loopback (its
gRPC servers bind the node's IP). Ray 2.60 has no option for it; this touches two functions of
``ray._private.services`` and nothing else.
"""

from __future__ import annotations

LOOPBACK = ("127.0.0.1", "localhost")


def is_loopback(address: str) -> bool:
    """Whether ``HOST:PORT`` names this machine's loopback interface."""
    return address.rpartition(":")[0] in LOOPBACK


def keep_loopback() -> None:
    """Make Ray take 127.0.0.1 as this node's IP (see the module)."""
    import ray._private.services as services

    services.resolve_ip_for_localhost = lambda host: host
    services.get_node_ip_address = lambda address=None: "127.0.0.1"
