"""`trainguard checkpoints list|verify`: what a resume would load, without torch."""

from __future__ import annotations

import json
import time
from pathlib import Path

from trainguard.checkpoint import Manifest, commit, damage, describe_files, new_tmp_dir
from trainguard.cli import main


def make_checkpoint(directory: Path, step: int, payload: bytes) -> Path:
    tmp = new_tmp_dir(directory, step)
    (tmp / "state.pt").write_bytes(payload)
    return commit(tmp, Manifest(step=step, files=describe_files(tmp), time=time.time()))


def test_list_shows_every_checkpoint_and_the_resume_step(tmp_path, capsys):
    for step in (100, 200, 300):
        make_checkpoint(tmp_path, step, bytes(range(256)) * 64)
    assert main(["checkpoints", "list", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [c["step"] for c in out["checkpoints"]] == [100, 200, 300]
    assert all(c["valid"] for c in out["checkpoints"])
    assert out["resume_step"] == 300


def test_verify_fails_a_flipped_newest_checkpoint_and_names_the_fallback(tmp_path, capsys):
    make_checkpoint(tmp_path, 100, b"a" * 10_000)
    newest = make_checkpoint(tmp_path, 200, b"b" * 10_000)
    damage(newest, "flip")
    assert main(["checkpoints", "verify", str(tmp_path), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["valid"] is False and "checksum" in out["reason"]
    assert out["resume_step"] == 100
    assert main(["checkpoints", "verify", str(tmp_path / "step-00000100")]) == 0


def test_a_missing_directory_is_a_clear_error(tmp_path, capsys):
    assert main(["checkpoints", "list", str(tmp_path / "nope")]) == 2
    assert "no such directory" in capsys.readouterr().err


def test_checkpoint_sizes_are_shown_in_a_unit_that_reads(capsys):
    from trainguard.cli.checkpoints import human_size

    assert [human_size(n) for n in (0, 812, 4 * 1024, 3 * 2**20 + 2**19, 7 * 2**30)] == [
        "0B",
        "812B",
        "4.0K",
        "3.5M",
        "7.0G",
    ]


def test_verify_names_a_rekinded_manifest_as_changed_after_signing(tmp_path, capsys):
    import zlib

    newest = make_checkpoint(tmp_path, 100, b"a" * 10_000)
    body = json.loads((newest / "manifest.json").read_bytes())
    body.pop("manifest_crc32")
    body["kind"] = "dcp"
    text = lambda obj: (json.dumps(obj, sort_keys=True, indent=1) + "\n").encode()  # noqa: E731
    body["manifest_crc32"] = f"{zlib.crc32(text(body)):08x}"
    (newest / "manifest.json").write_bytes(text(body))
    assert main(["checkpoints", "verify", str(newest), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["valid"] is False and "changed after it was signed" in out["reason"]


def test_key_shows_ids_never_secrets_and_rotation_keeps_the_old_key(tmp_path, capsys, monkeypatch):
    from trainguard.checkpoint.signing import KEY_FILE_ENV, load_keyring

    monkeypatch.setenv(KEY_FILE_ENV, str(tmp_path / "keys" / "checkpoint.key"))
    make_checkpoint(tmp_path, 100, b"a" * 100)
    old = load_keyring().signing
    assert main(["checkpoints", "key", "--rotate"]) == 0
    capsys.readouterr()
    assert main(["checkpoints", "key"]) == 0
    out = capsys.readouterr().out
    assert f"{old.id}  verifies" in out and "signs and verifies" in out
    assert old.secret.hex() not in out
    assert main(["checkpoints", "verify", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["signed"] is True
