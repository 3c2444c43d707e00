"""What signing and encryption at rest cost a checkpoint's save and load.

    python benchmarks/bench_checkpoint_trust.py                  # 256 MB state, 5 rounds
    python benchmarks/bench_checkpoint_trust.py --size-mb 1024 --rounds 7 --json

Three arms on the same state (linear layers plus Adam's two moments), interleaved round by round
(the order rotates every round), each a whole save and a whole load:

* ``plain``: ``torch.save`` to a file + fsync, and ``torch.load``: what a user runs without us;
* ``signed``: trainguard's default: ``write_replicated`` (CRC-32 and SHA-256 while writing, the
  signed manifest, the atomic commit), then a resume's ``verify`` (SHA-256 of every byte, the
  HMAC) and ``load_payload``;
* ``sealed``: the same with ``encrypt=True`` (AES-256-GCM in 64 MiB pieces; the load decrypts in
  memory).

Loads read from the page cache (the file was just written; dropping caches would disturb the
machine's other users), so they show CPU cost, not the disk. Keys: ``*_save_s`` and
``*_load_s`` (medians), ``sealed_vs_signed_save`` / ``_load`` and ``signed_vs_plain_save`` /
``_load`` (geometric means of per-round ratios, 95% CI).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from paired import ratio_ci
from targets import Target, finish

TARGETS = (
    Target("sealed_vs_signed_save", "<=", 2.5),
    Target("sealed_vs_signed_load", "<=", 3.0),
)


def make_payload(size_mb: int) -> dict[str, Any]:
    torch.manual_seed(0)
    width = 1024
    layers = max(1, size_mb * (1 << 20) // (3 * 4 * width * width))  # params + Adam's two moments
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, width)).square().mean().backward()
    opt.step()
    return {"trainguard": {"format": 1, "step": 1, "world_size": 1}, "model": model.state_dict(),
            "optimizer": opt.state_dict(), "local": []}  # fmt: skip


def run_plain(root: Path, payload: dict[str, Any]) -> tuple[float, float]:
    path = root / "plain.pt"
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    t1 = time.perf_counter()
    torch.load(path, map_location="cpu", weights_only=True)
    t2 = time.perf_counter()
    path.unlink()
    return t1 - t0, t2 - t1


def run_ours(root: Path, payload: dict[str, Any], encrypt: bool) -> tuple[float, float]:
    from trainguard.checkpoint import verify
    from trainguard.checkpoint.signing import load_keyring
    from trainguard.torch.loading import load_payload
    from trainguard.torch.writer import write_replicated

    directory = root / ("sealed" if encrypt else "signed")
    key = load_keyring(create=True).signing
    t0 = time.perf_counter()
    result = write_replicated(directory, 1, payload, key=key, encrypt=encrypt)
    t1 = time.perf_counter()
    checked = verify(result["path"])
    assert checked.ok and checked.manifest is not None, checked.reason
    load_payload(Path(result["path"]), checked.manifest, True, load_keyring)
    t2 = time.perf_counter()
    shutil.rmtree(directory)
    return t1 - t0, t2 - t1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="bench-trust-", dir=args.dir))
    os.environ.setdefault("TRAINGUARD_CHECKPOINT_KEY_FILE", str(root / "checkpoint.key"))
    payload = make_payload(args.size_mb)
    nbytes = sum(t.numel() * t.element_size() for t in payload["model"].values()) * 3
    arms = {
        "plain": lambda: run_plain(root, payload),
        "signed": lambda: run_ours(root, payload, False),
        "sealed": lambda: run_ours(root, payload, True),
    }
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in arms}
    try:
        for name in arms:  # warm-up, not counted: first-use imports and allocations
            arms[name]()
        order = list(arms)
        for i in range(args.rounds):
            for name in order[i % 3 :] + order[: i % 3]:
                got[name].append(arms[name]())
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out: dict[str, Any] = {"state_mb": round(nbytes / 2**20), "rounds": args.rounds}
    for name, runs in got.items():
        out[f"{name}_save_s"] = round(statistics.median(s for s, _ in runs), 3)
        out[f"{name}_load_s"] = round(statistics.median(ld for _, ld in runs), 3)
        out[f"{name}_save_range_s"] = [round(min(s for s, _ in runs), 3), round(max(s for s, _ in runs), 3)]
        out[f"{name}_load_range_s"] = [round(min(x for _, x in runs), 3), round(max(x for _, x in runs), 3)]
    for a, b in (("sealed", "signed"), ("signed", "plain")):
        for side, index in (("save", 0), ("load", 1)):
            est = ratio_ci([r[index] for r in got[a]], [r[index] for r in got[b]])
            out.update(est.as_json(f"{a}_vs_{b}_{side}", 3))
    out["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        print(json.dumps(out))
    else:
        for key, value in out.items():
            print(f"{key:>32}: {value}")
    return finish("bench_checkpoint_trust", TARGETS, out, json_mode=args.json)


if __name__ == "__main__":
    sys.exit(main())
