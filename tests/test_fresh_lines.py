"""Log rules on real lines from sources the rules were not written from (tests/data/real/fresh_*.tsv).

The lines come from public issue threads of TF/Keras, JAX/XLA, Slurm job output, DeepSpeed and
NCCL users that no earlier set used (each row names its thread). They were split by sha1(line)
into a dev half, which the rules for TF/Keras/XLA/NCCL-allocator OOM, host memory, elastic
rendezvous loss and torch 2.3+ watchdog wordings were grown from (by shape, not by line), and a
held-out half that was not read while writing them. Before those rules: dev 6/22, held out 13/30.
`pytest -s` prints the per-category table.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from test_real_lines import _rows, score  # type: ignore[import-not-found]
from trainguard.detect.scan import classify_line

DATA = Path(__file__).parent / "data" / "real"


@pytest.mark.parametrize("name,floor", [("fresh_dev.tsv", 1.0), ("fresh_heldout.tsv", 0.9)])
def test_fresh_real_lines_are_classified(name: str, floor: float) -> None:
    rows = _rows(DATA / name)
    assert all(url.startswith("https://github.com/") for _, url, _ in rows)
    right = sum(
        1
        for expected, _, line in rows
        if (((e := classify_line(line)) and e.category.value) or "none") == expected
    )
    print(f"\n{name}: {right} of {len(rows)} right")
    for category, (precision, recall, n) in score(rows, classify_line).items():
        if n:
            print(f"  {category:<18} precision {precision:.2f} recall {recall:.2f} lines {n}")
    assert right / len(rows) >= floor


def test_fresh_sets_share_no_line_and_no_thread_with_the_rule_sets() -> None:
    old = {url for f in ("lines.tsv", "heldout.tsv") for _, url, _ in _rows(DATA / f)}
    dev, held = _rows(DATA / "fresh_dev.tsv"), _rows(DATA / "fresh_heldout.tsv")
    assert not {line for *_, line in dev} & {line for *_, line in held}
    assert not {url for _, url, _ in dev + held} & old
