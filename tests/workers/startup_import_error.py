"""A training script whose import fails on every try: a dependency missing from the image.

It never imports trainguard. ``trainguard run`` stops it on the second identical failure
(exit 3) instead of spending the restart budget on it.

    trainguard run --standalone --nproc-per-node 2 tests/workers/startup_import_error.py
"""

from __future__ import annotations

import torch.distributed as dist
import webdataset_that_is_not_installed  # noqa: F401  # the dependency the image lacks


def main() -> None:
    dist.init_process_group("gloo")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
