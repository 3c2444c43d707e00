"""Training-side trainguard: runs inside the user's PyTorch process (imports torch).

>>> from trainguard.torch import Checkpointer, ResumableSampler, ShareSampler, TrainState  # doctest: +SKIP
"""

from __future__ import annotations

from trainguard.torch.checkpoint import Checkpointer
from trainguard.torch.data import ResumableSampler
from trainguard.torch.guard import Guard
from trainguard.torch.shares import ShareSampler
from trainguard.torch.state import TrainState

__all__ = [
    "Checkpointer",
    "Guard",
    "ResumableSampler",
    "ShareSampler",
    "TrainState",
]
