"""The torch-free checkpoint layer: manifest integrity, verification, listing, retention."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainguard.checkpoint import (
    ChecksumFile,
    Manifest,
    apply_retention,
    clean_stale,
    commit,
    damage,
    decode_manifest,
    describe_files,
    encode_manifest,
    list_checkpoints,
    new_tmp_dir,
    newest_valid,
    plan_deletions,
    read_latest,
    verify,
)


def make_checkpoint(directory: Path, step: int, payload: bytes = b"x" * 1000) -> Path:
    tmp = new_tmp_dir(directory, step)
    sink = ChecksumFile(tmp / "state.pt")
    sink.write(payload)
    entry = sink.close()
    return commit(tmp, Manifest(step=step, files={"state.pt": entry}, time=time.time()))


def test_import_checkpoint_pulls_no_torch():
    code = "import sys, trainguard.checkpoint; print('torch' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


def test_committed_checkpoint_verifies_and_moves_latest(tmp_path):
    path = make_checkpoint(tmp_path, 100)
    assert path.name == "step-00000100"
    assert verify(path).ok
    assert read_latest(tmp_path) == 100
    assert [c.step for c in list_checkpoints(tmp_path)] == [100]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_checksum_file_matches_a_reread_of_the_file(tmp_path):
    sink = ChecksumFile(tmp_path / "f")
    for chunk in (b"a" * 10, memoryview(b"b" * (70 << 20)), bytearray(b"c" * 3)):
        sink.write(chunk)
    entry = sink.close()
    assert describe_files(tmp_path)["f"] == entry
    assert entry.size == 10 + (70 << 20) + 3


def test_every_flipped_byte_of_the_manifest_is_detected(tmp_path):
    manifest = Manifest(step=7, files={"state.pt": describe_files(_one_file(tmp_path))["state.pt"]}, time=1.5)
    data = encode_manifest(manifest)
    assert decode_manifest(data).step == 7
    for i in range(len(data)):
        for mask in (0x01, 0x20, 0x80):
            bad = bytearray(data)
            bad[i] ^= mask
            with pytest.raises(ValueError):
                decode_manifest(bytes(bad))


def _one_file(tmp_path: Path) -> Path:
    d = tmp_path / "d"
    d.mkdir()
    (d / "state.pt").write_bytes(b"payload")
    return d


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda p: (p / "manifest.json").unlink(), "no manifest"),
        (lambda p: (p / "state.pt").unlink(), "missing file state.pt"),
        (lambda p: (p / "state.pt").write_bytes(b"x" * 999), "size mismatch"),
        (lambda p: (p / "state.pt").write_bytes(b"x" * 500 + b"y" + b"x" * 499), "checksum mismatch"),
        (lambda p: (p / "manifest.json").write_bytes(b"{"), "manifest.json"),
    ],
)
def test_verify_names_what_is_wrong(tmp_path, damage, reason):
    path = make_checkpoint(tmp_path, 5)
    damage(path)
    result = verify(path)
    assert not result.ok
    assert reason in result.reason


def test_newest_valid_skips_a_corrupt_newest_checkpoint(tmp_path, caplog):
    make_checkpoint(tmp_path, 10)
    newest = make_checkpoint(tmp_path, 20)
    (newest / "state.pt").write_bytes(b"z" * 1000)
    info = newest_valid(tmp_path)
    assert info is not None and info.step == 10
    assert "skipping invalid checkpoint" in caplog.text


def test_torn_temporary_directories_are_ignored_and_cleaned(tmp_path):
    make_checkpoint(tmp_path, 1)
    torn = new_tmp_dir(tmp_path, 2)
    (torn / "state.pt").write_bytes(b"half")
    assert [c.step for c in list_checkpoints(tmp_path)] == [1]
    assert newest_valid(tmp_path).step == 1
    assert clean_stale(tmp_path) == 1
    assert not torn.exists()


def test_commit_replaces_a_corrupt_checkpoint_of_the_same_step(tmp_path):
    old = make_checkpoint(tmp_path, 3)
    (old / "state.pt").write_bytes(b"garbage")
    make_checkpoint(tmp_path, 3, b"fresh")
    assert verify(tmp_path / "step-00000003").ok
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_retention_keeps_last_k_and_milestones():
    steps = [100, 200, 300, 400, 500, 600]
    assert plan_deletions(steps, 600, keep_last=2, milestone_every=300) == [100, 200, 400]
    assert plan_deletions(steps, 600, keep_last=0) == []
    # checkpoints newer than the current one belong to an abandoned timeline: left alone
    assert plan_deletions([100, 200, 900], 200, keep_last=1) == [100]
    # the just-written checkpoint is never deleted, even with keep_last=1 and duplicates
    assert 600 not in plan_deletions(steps, 600, keep_last=1)


def test_apply_retention_deletes_only_older_checkpoints(tmp_path):
    for step in (1, 2, 3, 4):
        make_checkpoint(tmp_path, step)
    assert apply_retention(tmp_path, 4, keep_last=2, milestone_every=0) == [1, 2]
    assert [c.step for c in list_checkpoints(tmp_path)] == [3, 4]
    assert newest_valid(tmp_path).step == 4


@pytest.mark.parametrize("how", ["flip", "truncate", "delete-manifest", "delete-file"])
def test_damage_for_chaos_drills_makes_the_newest_checkpoint_invalid(tmp_path, how):
    make_checkpoint(tmp_path, 1)
    newest = make_checkpoint(tmp_path, 2)
    note = damage(newest, how, random.Random(7))
    assert note
    assert not verify(newest).ok
    assert newest_valid(tmp_path).step == 1


def test_the_fast_crc32_gives_zlibs_values_so_either_verifies_the_other(monkeypatch):
    import zlib

    from trainguard.checkpoint import manifest

    data = random.Random(3).randbytes(3 << 20)
    monkeypatch.setattr(manifest, "_crc32_impl", None)
    assert manifest.crc32(data) == zlib.crc32(data)
    assert manifest.crc32(data[1000:], manifest.crc32(data[:1000])) == zlib.crc32(data)


def test_a_fast_crc32_that_disagrees_with_zlib_is_not_used(monkeypatch):
    import zlib

    isal = pytest.importorskip("isal")
    from isal import isal_zlib

    from trainguard.checkpoint import manifest

    monkeypatch.setattr(isal_zlib, "crc32", lambda data, value=0: 0, raising=False)
    assert isal is not None and manifest._pick_crc32() is zlib.crc32
