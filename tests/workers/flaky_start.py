"""A training script whose start fails twice, each time differently, then works: a shared file
system that is slow to mount. The failures share their type and line but not their message (a
different shard each time), so they are not the same failure and no crash loop is declared.

It never imports trainguard. ``--tries FILE`` counts the starts.

    trainguard run --nproc-per-node 1 tests/workers/flaky_start.py --tries /tmp/tries
"""

from __future__ import annotations

import argparse
from pathlib import Path


def open_shard(index: int) -> None:
    raise OSError(f"shard {index} is not readable yet")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tries", type=Path, required=True)
    tries = parser.parse_args().tries
    n = int(tries.read_text()) if tries.exists() else 0
    tries.write_text(str(n + 1))
    if n < 2:
        open_shard((3, 7)[n])
    print("trained")


if __name__ == "__main__":
    main()
