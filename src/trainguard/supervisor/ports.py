"""A port for the workers' own TCPStore on a single node, chosen where nothing else takes it.

The supervisor has each attempt's workers host a fresh store (see ``Supervisor._build_agent``).
torch picks its port by binding port 0 and closing it; rank 0's worker binds it seconds later,
and meanwhile any outgoing connection on the host may be given that same port by the kernel,
which takes them from the ephemeral range: the rank then dies of EADDRINUSE (2 runs in 30 on a
busy machine). A port below that range is never handed out implicitly.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def private_port(rng: random.Random | None = None, tries: int = 64) -> int:
    """A free TCP port below the ephemeral range (any free port if there is no room below it)."""
    rng = rng or random.Random()
    low = _ephemeral_low()
    top = low - 1
    bottom = max(1024, top - 12000)
    for _ in range(tries if top > bottom else 0):
        port = rng.randint(bottom, top)
        if _free(port):
            return port
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _ephemeral_low() -> int:
    try:
        return int(_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True
