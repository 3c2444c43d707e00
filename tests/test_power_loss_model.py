"""The power-loss crash-state model of benchmarks/power_loss.py finds the states a careless save
protocol leaves, and none that a careful one cannot."""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))

from power_loss import Op, crash_states, parse

ROOT = "/ck"


def states(tmp_path: Path, ops: list[Op], final: dict[str, bytes]) -> list[dict[str, bytes]]:
    before, after = tmp_path / "before", tmp_path / "after"
    before.mkdir()
    for name, data in final.items():
        (after / name).parent.mkdir(parents=True, exist_ok=True)
        (after / name).write_bytes(data)
    out = []
    for _, tree in crash_states(before, after, ops, random.Random(0), subsets=4):
        out.append({name: bytes(tree.data.get(inode, b"")) for name, inode in tree.files.items()})
    return out


def careless() -> list[Op]:  # data never fsync'd before the rename
    return [
        Op("mkdir", "tmp"),
        Op("create", "tmp/x", inode=1),
        Op("write", inode=1, offset=0, size=4),
        Op("fsync", "tmp"),
        Op("rename", "tmp", "step"),
        Op("fsync", ""),
    ]


def test_a_rename_before_the_data_is_durable_can_publish_an_empty_file(tmp_path):
    found = states(tmp_path, careless(), {"step/x": b"data"})
    assert {"step/x": b""} in found  # what a power cut may leave: the name, not the bytes
    assert {"step/x": b"data"} in found


def test_a_careful_save_never_publishes_missing_data(tmp_path):
    ops = careless()
    ops.insert(3, Op("fsync", "tmp/x", inode=1))  # fsync the file before the directory and the rename
    found = states(tmp_path, ops, {"step/x": b"data"})
    assert all(s.get("step/x", b"data") == b"data" for s in found)


def test_strace_lines_become_ops_relative_to_the_checkpoint_directory():
    lines = [
        '1 mkdir("/ck/.tmp-1", 0777) = 0',
        '1 openat(AT_FDCWD</w>, "/ck/.tmp-1/state.pt", O_WRONLY|O_CREAT|O_TRUNC|O_CLOEXEC, 0644) = 3</ck/.tmp-1/state.pt>',
        '1 write(3</ck/.tmp-1/state.pt>, ""..., 30) = 30',
        '1 write(3</ck/.tmp-1/state.pt>, ""..., 8) = 8',
        "1 fsync(3</ck/.tmp-1/state.pt>) = 0",
        '1 openat(AT_FDCWD</w>, "/ck", O_RDONLY|O_CLOEXEC) = 4</ck>',
        "1 fsync(4</ck>) = 0",
        '1 rename("/ck/.tmp-1", "/ck/step-1") = 0',
        '1 unlinkat(5</ck/.trash-0>, "state.pt", 0) = 0',
        '1 openat(AT_FDCWD</w>, "/elsewhere/log", O_WRONLY|O_CREAT, 0644) = 6</elsewhere/log>',
    ]
    kinds = [(op.kind, op.path, op.offset, op.size) for op in parse(lines, ROOT)]
    assert kinds == [
        ("mkdir", ".tmp-1", 0, 0),
        ("create", ".tmp-1/state.pt", 0, 0),
        ("trunc", ".tmp-1/state.pt", 0, 0),
        ("write", "", 0, 30),
        ("write", "", 30, 8),
        ("fsync", ".tmp-1/state.pt", 0, 0),
        ("fsync", "", 0, 0),
        ("rename", ".tmp-1", 0, 0),
        ("unlink", ".trash-0/state.pt", 0, 0),
    ]
