"""``ResumableSampler``: a ``DistributedSampler`` whose position survives a restart.

    >>> sampler = ResumableSampler(dataset, shuffle=True, seed=0)     # doctest: +SKIP
    >>> loader = DataLoader(dataset, batch_size=32, sampler=sampler,   # doctest: +SKIP
    ...                     generator=torch.Generator())
    >>> step = ckpt.resume(TrainState(model, opt, sampler=sampler))     # doctest: +SKIP
    >>> for epoch in itertools.count(sampler.epoch):                   # doctest: +SKIP
    ...     sampler.set_epoch(epoch)     # same epoch as restored: keeps the position
    ...     for batch in loader: ...

The shard of each rank is the one ``torch.utils.data.DistributedSampler`` gives for the same
``num_replicas``, ``rank``, ``shuffle``, ``seed``, ``epoch`` and ``drop_last``.

Position tracking (``state_dict() == {"epoch": e, "offset": n, ...}``, n = samples of epoch e
this rank has consumed):

* default, exact with ``DataLoader(num_workers=0)``: the offset counts the indices the sampler has
  handed out. Such a loader pulls a batch's indices only when the training loop asks for the batch,
  so after k batches the offset is k * batch_size. When the last index of an epoch is handed out
  the sampler moves to (e + 1, 0) by itself, so a checkpoint taken after an epoch's last batch
  resumes at the next epoch.
* with worker processes (``num_workers > 0``) the loader prefetches indices ahead of training, so
  call ``sampler.advance(batch_size)`` after each step instead; from the first ``advance`` on only
  explicit advances move the position.

Give the DataLoader its own ``generator``: otherwise each ``iter(loader)`` draws its base seed
from the global torch RNG, and a resume in the middle of an epoch would shift that RNG by a draw.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import Sampler

from trainguard.errors import ConfigError

log = logging.getLogger(__name__)


def replica_of(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """(world size, rank) as torch's DistributedSampler takes them: the process group's where not
    given (one replica without one); a rank outside the world is a ConfigError (a ValueError)."""
    if num_replicas is None or rank is None:
        initialized = torch.distributed.is_available() and torch.distributed.is_initialized()
        if num_replicas is None:
            num_replicas = torch.distributed.get_world_size() if initialized else 1
        if rank is None:
            rank = torch.distributed.get_rank() if initialized else 0
    if not 0 <= rank < num_replicas:
        raise ConfigError(f"invalid rank {rank}, should be in [0, {num_replicas - 1}]")
    return num_replicas, rank


def epoch_order(n: int, shuffle: bool, seed: int, epoch: int) -> list[int]:
    """The order of ``n`` samples in ``epoch``: DistributedSampler's (a permutation seeded by
    ``seed + epoch`` from a generator of its own), or ``0..n-1`` without shuffling."""
    if not shuffle:
        return list(range(n))
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    order: list[int] = torch.randperm(n, generator=g).tolist()
    return order


class ResumableSampler(Sampler[int]):
    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        num_replicas, rank = replica_of(num_replicas, rank)
        self.dataset = dataset
        self.num_replicas, self.rank = num_replicas, rank
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        n = len(dataset)
        if drop_last and n % num_replicas != 0:
            self.num_samples = math.ceil((n - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas
        self.epoch = 0
        self.offset = 0
        self._explicit = False
        self._iter_start: tuple[int, int] | None = None  # (epoch, offset) the last iteration began at

    def __len__(self) -> int:
        return self.num_samples

    def shard(self, epoch: int) -> list[int]:
        """This rank's indices for an epoch, exactly as DistributedSampler orders them."""
        indices = epoch_order(len(self.dataset), self.shuffle, self.seed, epoch)
        if not self.drop_last:
            padding = self.total_size - len(indices)
            if padding <= len(indices):
                indices += indices[:padding]
            else:
                indices += (indices * math.ceil(padding / len(indices)))[:padding]
        else:
            indices = indices[: self.total_size]
        return indices[self.rank : self.total_size : self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        epoch = self.epoch
        indices = self.shard(epoch)
        start = self.offset if self.offset < len(indices) else 0
        self._iter_start = (epoch, start)
        for i in range(start, len(indices)):
            if not self._explicit and self.epoch == epoch:
                if i + 1 == len(indices):
                    self.epoch, self.offset = epoch + 1, 0
                else:
                    self.offset = i + 1
            yield indices[i]

    def set_epoch(self, epoch: int) -> None:
        """Like DistributedSampler.set_epoch; setting the current epoch keeps the position."""
        if epoch != self.epoch:
            self.epoch, self.offset = epoch, 0

    def advance(self, n: int) -> None:
        """Record that training consumed ``n`` more samples (switches to explicit tracking)."""
        if not self._explicit:
            self._explicit = True
            if self._iter_start is not None:  # forget what a prefetching loader pulled so far
                self.epoch, self.offset = self._iter_start
        self.offset += n
        if self.offset >= self.num_samples:
            self.epoch, self.offset = self.epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "offset": self.offset,
            "num_replicas": self.num_replicas,
            "rank": self.rank,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_samples": self.num_samples,
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.epoch = int(sd["epoch"])
        offset = int(sd["offset"])
        replicas = int(sd.get("num_replicas", self.num_replicas))
        if replicas != self.num_replicas:
            # Another world size shards differently: keep the epoch's global progress, approximately.
            offset = offset * replicas // self.num_replicas
            log.warning(
                "sampler state from %d replicas loaded into %d: continuing epoch %d at about the same "
                "global position (not sample-exact)",
                replicas,
                self.num_replicas,
                self.epoch,
            )
        if sd.get("seed", self.seed) != self.seed or sd.get("shuffle", self.shuffle) != self.shuffle:
            log.warning("sampler seed/shuffle differ from the checkpoint's: the data order changes")
        self.offset = min(offset, self.num_samples)
