"""torch.distributed.checkpoint's file reader and load planner, minus the pickle that runs code.

``FileSystemReader.read_metadata`` unpickles ``.metadata`` with plain ``pickle``, and
``DefaultLoadPlanner.load_bytes`` loads every non-tensor value with ``weights_only=False``: a
checkpoint folder someone else could write was a command the resume ran. ``VerifiedReader``
unpickles ``.metadata`` from the bytes the verified manifest lists (read once, checked, used),
allowing only the dataclasses and enums of DCP's metadata, ``torch.Size``, dtypes and a path;
``SafeLoadPlanner`` loads non-tensor values with ``weights_only`` (True by default).
"""

from __future__ import annotations

import dataclasses
import enum
import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from trainguard.checkpoint import Manifest
from trainguard.errors import CheckpointCorrupt
from trainguard.torch.loading import read_checked

_METADATA_MODULES = (
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.filesystem",
    "torch.distributed.checkpoint.planner",
)
_PLAIN = {
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a lookup in a table of layouts
}


class MetadataUnpickler(pickle.Unpickler):
    """Builds DCP metadata, refuses every other global (so no function is ever called)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _PLAIN:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype | torch.memory_format):
            return getattr(torch, name)
        if module in _METADATA_MODULES:
            obj = super().find_class(module, name)
            if isinstance(obj, type) and (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum)):
                return obj
        raise pickle.UnpicklingError(f"checkpoint metadata may not name {module}.{name}")


def load_metadata(data: bytes) -> Metadata:
    try:
        metadata = MetadataUnpickler(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError, ValueError) as exc:
        raise CheckpointCorrupt(f"sharded checkpoint metadata refused: {exc}") from None
    if not isinstance(metadata, Metadata):
        raise CheckpointCorrupt(f"sharded checkpoint metadata is a {type(metadata).__name__}, not Metadata")
    return metadata


class VerifiedReader(FileSystemReader):
    """DCP's file reader, reading metadata only as the verified manifest lists it. The global
    ``.metadata`` is read and checked here, before torch's loader starts (which would turn a
    refusal into a fallback to other files, then into its own BaseException)."""

    def __init__(self, path: Path, manifest: Manifest) -> None:
        super().__init__(path)
        self._root = Path(path)
        self._manifest = manifest
        self._global = self._read(".metadata")

    def _read(self, name: str) -> Metadata:
        entry = self._manifest.files.get(name)
        if entry is None:
            raise CheckpointCorrupt(f"{self._root / name} is not in the checkpoint's manifest")
        return load_metadata(read_checked(self._root / name, entry, self._manifest.signature is not None))

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        metadata = self._global if rank is None else self._read(f"__{rank}.metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        assert metadata.storage_meta is not None
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default planner, loading non-tensor values with ``weights_only``."""

    def __init__(self, weights_only: bool = True, **kw: Any) -> None:
        super().__init__(**kw)
        self.weights_only = weights_only

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=self.weights_only)
        fqn = read_item.dest_index.fqn
        if self.flatten_state_dict:
            # where DefaultLoadPlanner.load_bytes puts it (a private helper of torch's)
            from torch.distributed.checkpoint._traverse import set_element

            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded
