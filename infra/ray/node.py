"""``ray`` (the CLI) on loopback: ``python infra/ray/node.py start --head ...`` is ``ray start
--head ...`` with every server of the node bound to 127.0.0.1 (solvers.ray_loopback says why
the plain CLI cannot)."""

import sys

from solvers.ray_loopback import keep_loopback

keep_loopback()
from ray.scripts.scripts import main  # noqa: E402 - after the patch

sys.argv = ["ray", *sys.argv[1:]]
main()
