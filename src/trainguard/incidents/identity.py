"""Who wrote a row: the node's identity, stamped on every row of the store, and row keys.

    >>> node = NodeIdentity("gpu-017", rack="r03", group="h100-a", gpu_uuids=("GPU-aa", "GPU-bb"))
    >>> node.uuid_of(1), node.uuid_of(7), node.uuid_of(None)
    ('GPU-bb', None, None)
    >>> row_key("verdict", "gpu-017", 3, 100.0) == row_key("verdict", "gpu-017", 3, 100.0)
    True

``row_key`` is the idempotency key of a written row: the same facts give the same key, so a
retried insert or a spool replayed twice lands once (``ON CONFLICT (key) DO NOTHING``).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from dataclasses import dataclass
from typing import Any

RACK_ENV = "TRAINGUARD_RACK"
GROUP_ENV = "TRAINGUARD_NODE_GROUP"
HOST_ENV = "TRAINGUARD_HOSTNAME"


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    host: str
    rack: str | None = None  # physical placement: the rack (a power and switch domain)
    group: str | None = None  # a label: the node pool, partition or GPU type
    gpu_uuids: tuple[str | None, ...] = ()  # by GPU index, as NVML reports them

    def uuid_of(self, gpu: int | None) -> str | None:
        if gpu is None or not 0 <= gpu < len(self.gpu_uuids):
            return None
        return self.gpu_uuids[gpu]

    def with_gpus(self, uuids: tuple[str | None, ...]) -> NodeIdentity:
        return NodeIdentity(self.host, self.rack, self.group, tuple(uuids))

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, host: str | None = None) -> NodeIdentity:
        """``$TRAINGUARD_HOSTNAME`` (else the host name), ``$TRAINGUARD_RACK``, ``$TRAINGUARD_NODE_GROUP``."""
        env = os.environ if environ is None else environ
        return cls(
            host=host or env.get(HOST_ENV) or socket.gethostname(),
            rack=env.get(RACK_ENV) or None,
            group=env.get(GROUP_ENV) or None,
        )


def gpu_uuids(verdict: Any) -> tuple[str | None, ...]:
    """A node verdict's GPU UUIDs by GPU index, as `NodeIdentity.gpu_uuids` holds them."""
    return tuple(g.gpu.uuid for g in sorted(verdict.gpus, key=lambda g: g.gpu.index))


def row_key(kind: str, *facts: Any) -> str:
    """A stable key for one row from the facts that make it that row."""
    text = json.dumps([kind, *facts], default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]
