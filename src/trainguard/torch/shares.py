"""``ShareSampler``: a batch sampler that gives each rank its share of every step's global batch,
shares that may change from one step to the next, and a position that survives a restart.

    >>> sampler = ShareSampler(dataset, global_batch=128, seed=0)         # doctest: +SKIP
    >>> loader = DataLoader(dataset, batch_sampler=sampler)               # doctest: +SKIP
    >>> state = TrainState(model, opt, sampler=sampler)                   # doctest: +SKIP
    >>> x, y = next(batches)                                              # doctest: +SKIP
    >>> loss = F.cross_entropy(model(x), y) * sampler.weight(len(y))     # doctest: +SKIP

Step ``k`` of an epoch trains on the samples ``k*B .. (k+1)*B - 1`` of the epoch's order (the
same seeded permutation as ``DistributedSampler``, so the steps train on the same global batches
as DistributedSampler with ``B / W`` samples per rank). Rank ``i`` takes a contiguous slice of
``shares[i]`` of them. ``sampler.weight(n)`` is ``W * n / B``: with it, DDP's average of the
ranks' mean losses is the mean over the whole global batch, whatever the split (docs/balance.md).
Shares change through `schedule`, from a global batch index every rank agreed on
(``trainguard.torch.balance`` does it at a step boundary).

Every step holds exactly ``B`` samples: with ``drop_last`` an epoch's last, partial global batch
is dropped; without, it is filled up from the start of the epoch's order (as DistributedSampler
pads its shards).

Position: ``state_dict()`` holds the epoch and the global batches of it consumed, and the shares
in effect from there on (the position is global, so a resumed job continues at the exact sample
with the same shares, or uniform ones if the world size changed). With ``DataLoader(num_workers=0)``
the batches handed out are the batches consumed; with worker processes (which prefetch) call
``sampler.advance()`` after each step instead.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Iterator, Sequence, Sized
from typing import Any

from torch.utils.data import Sampler

from trainguard.balance.shares import loss_weight, uniform
from trainguard.errors import ConfigError
from trainguard.torch.data import epoch_order, replica_of

log = logging.getLogger(__name__)

__all__ = ["ShareSampler"]


class ShareSampler(Sampler[list[int]]):
    def __init__(
        self,
        dataset: Sized,
        global_batch: int,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        num_replicas, rank = replica_of(num_replicas, rank)
        n = len(dataset)
        if global_batch < num_replicas:
            raise ConfigError(
                f"global_batch={global_batch} is smaller than the {num_replicas} ranks: each needs a sample"
            )
        if n < global_batch:
            raise ConfigError(f"the dataset holds {n} samples, fewer than one global batch of {global_batch}")
        self.dataset = dataset
        self.global_batch, self.num_replicas, self.rank = global_batch, num_replicas, rank
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.batches_per_epoch = n // global_batch if drop_last else math.ceil(n / global_batch)
        self.epoch = 0
        self.step = 0  # global batches of ``epoch`` consumed
        self.produced = 0  # global batch index (over all epochs) of the next batch handed out
        # (first global batch index, shares from there on), by index; the first entry is 0
        self._plan: list[tuple[int, tuple[int, ...]]] = [(0, uniform(global_batch, num_replicas))]
        self._explicit = False
        self._iter_start: int | None = None  # the position the last iteration began at
        self._order: tuple[int, list[int]] | None = None  # (epoch, its order), the last one made

    # -- shares ---------------------------------------------------------------------------------
    @property
    def position(self) -> int:
        """Global batches consumed since the start of training (epoch * batches_per_epoch + step)."""
        return self.epoch * self.batches_per_epoch + self.step

    def shares_at(self, index: int) -> tuple[int, ...]:
        """The shares of global batch ``index``."""
        keys = [i for i, _ in self._plan]
        return self._plan[bisect.bisect_right(keys, index) - 1][1]

    @property
    def shares(self) -> tuple[int, ...]:
        """The shares of the next batch to consume."""
        return self.shares_at(self.position)

    def schedule(self, first: int, shares: Sequence[int]) -> None:
        """Use ``shares`` from global batch ``first`` on. Every rank must schedule the same shares
        from the same index, one that no rank has handed out yet (see ``produced``)."""
        shares = tuple(int(s) for s in shares)
        if len(shares) != self.num_replicas or sum(shares) != self.global_batch or min(shares) < 1:
            raise ConfigError(
                f"shares {shares} must give each of {self.num_replicas} ranks at least one sample "
                f"and sum to the global batch {self.global_batch}"
            )
        if first < self.produced:
            raise ConfigError(
                f"shares scheduled from global batch {first}, but this rank handed out batches up to "
                f"{self.produced - 1} already: schedule from an index no rank has reached"
            )
        self._plan = [(i, s) for i, s in self._plan if i < first] + [(first, shares)]

    def weight(self, n: int) -> float:
        """The factor on this rank's mean loss over its ``n`` samples (``W * n / B``)."""
        return loss_weight(n, self.global_batch, self.num_replicas)

    # -- iteration --------------------------------------------------------------------------------
    def order(self, epoch: int) -> list[int]:
        """The epoch's sample order, as many samples as its global batches hold."""
        if self._order is not None and self._order[0] == epoch:
            return self._order[1]
        indices = epoch_order(len(self.dataset), self.shuffle, self.seed, epoch)
        size = self.batches_per_epoch * self.global_batch
        while len(indices) < size:  # fill the last global batch from the start of the order
            indices += indices[: size - len(indices)]
        self._order = (epoch, indices[:size])
        return self._order[1]

    def batch(self, index: int) -> list[int]:
        """This rank's samples of global batch ``index`` (counted over all epochs)."""
        epoch, k = divmod(index, self.batches_per_epoch)
        shares = self.shares_at(index)
        start = k * self.global_batch + sum(shares[: self.rank])
        return self.order(epoch)[start : start + shares[self.rank]]

    def __len__(self) -> int:
        return self.batches_per_epoch

    def __iter__(self) -> Iterator[list[int]]:
        """The rest of the current epoch from the current position, one batch per step."""
        epoch, start = self.epoch, self.step
        self._iter_start = self.position
        self.produced = max(self.produced, self.position)
        for k in range(start, self.batches_per_epoch):
            index = epoch * self.batches_per_epoch + k
            batch = self.batch(index)
            self.produced = max(self.produced, index + 1)
            if not self._explicit and self.epoch == epoch:
                self.epoch, self.step = divmod(index + 1, self.batches_per_epoch)
            yield batch

    def set_epoch(self, epoch: int) -> None:
        """Like DistributedSampler.set_epoch; setting the current epoch keeps the position."""
        if epoch != self.epoch:
            self.epoch, self.step = epoch, 0

    def advance(self, n: int = 1) -> None:
        """Record that training consumed ``n`` more global batches (switches to explicit tracking,
        for loaders with worker processes)."""
        if not self._explicit:
            self._explicit = True
            if self._iter_start is not None:  # forget what a prefetching loader pulled so far
                self.epoch, self.step = divmod(self._iter_start, self.batches_per_epoch)
        self.epoch, self.step = divmod(self.position + n, self.batches_per_epoch)

    # -- checkpoint -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        pos = self.position
        plan = [[pos, list(self.shares_at(pos))]] + [[i, list(s)] for i, s in self._plan if i > pos]
        return {
            "epoch": self.epoch,
            "step": self.step,
            "global_batch": self.global_batch,
            "num_replicas": self.num_replicas,
            "rank": self.rank,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "shares": plan,
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        step, batch = int(sd["step"]), int(sd.get("global_batch", self.global_batch))
        if batch != self.global_batch:
            # Another global batch cuts the epoch differently: keep the samples consumed, about.
            log.warning(
                "sampler state with global batch %d loaded into %d: continuing epoch %s at about the "
                "same sample (not sample-exact)",
                batch,
                self.global_batch,
                sd["epoch"],
            )
            step = step * batch // self.global_batch
        if sd.get("seed", self.seed) != self.seed or sd.get("shuffle", self.shuffle) != self.shuffle:
            log.warning("sampler seed/shuffle differ from the checkpoint's: the data order changes")
        self.epoch, self.step = divmod(
            int(sd["epoch"]) * self.batches_per_epoch + step, self.batches_per_epoch
        )
        self.produced = self.position
        self._order = None
        self._plan = [(0, uniform(self.global_batch, self.num_replicas))]
        plan = [(int(i), tuple(int(x) for x in s)) for i, s in sd.get("shares", ())]
        fits = all(
            len(s) == self.num_replicas and sum(s) == self.global_batch and min(s) >= 1 for _, s in plan
        )
        if not plan or not fits:
            if plan:
                log.warning(
                    "sampler shares %s do not fit %d ranks and a global batch of %d: uniform shares "
                    "until the next rebalance",
                    [s for _, s in plan],
                    self.num_replicas,
                    self.global_batch,
                )
            return
        self._plan = [(0, plan[0][1])] + [(i, s) for i, s in plan[1:] if i > self.position]
