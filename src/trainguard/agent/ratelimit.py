"""The agent's per-client rate limit: a token bucket per client address.

The tokens that say who may ask live in trainguard/tokens.py (the remediation webhook's secret
follows the same file rules); agent/api.py checks the token first, then this limit.
"""

from __future__ import annotations

import time

__all__ = ["RateLimiter"]


class RateLimiter:
    """A token bucket per client address: ``rate`` requests per second, ``burst`` at once.

    Bounded: past ``max_clients`` addresses the buckets that are full again are forgotten.
    """

    def __init__(
        self, rate: float, burst: int, max_clients: int = 4096, clock: object = time.monotonic
    ) -> None:
        self.rate, self.burst, self.max_clients = rate, burst, max_clients
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, when)

    def allow(self, client: str) -> bool:
        now: float = self._clock()  # type: ignore[operator]
        tokens, when = self._buckets.get(client, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - when) * self.rate)
        if tokens < 1.0:
            self._buckets[client] = (tokens, now)
            return False
        if client not in self._buckets and len(self._buckets) >= self.max_clients:
            self._forget_full(now)
        self._buckets[client] = (tokens - 1.0, now)
        return True

    def _forget_full(self, now: float) -> None:
        full = [c for c, (t, w) in self._buckets.items() if t + (now - w) * self.rate >= self.burst]
        for c in full or list(self._buckets)[: len(self._buckets) // 2]:
            del self._buckets[c]
