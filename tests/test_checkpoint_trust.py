"""A checkpoint folder someone else can write, attacked the way issue 34 did: a re-kinded manifest
that sends the resume through torch's sharded loader with a pickle in ``.metadata``, weights
rewritten under a consistent manifest, pickles inside a sharded checkpoint. Each attack edits the
files as an attacker would (JSON and zlib, not our encoder), and a marker file shows whether the
attacker's pickle ran."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import zlib
from pathlib import Path

import pytest
import torch

from trainguard.checkpoint import list_checkpoints, verify
from trainguard.checkpoint.signing import KEY_FILE_ENV, Keyring, Trust, load_keyring, rotate
from trainguard.errors import CheckpointCorrupt, CheckpointError, ConfigError
from trainguard.torch import Checkpointer, TrainState

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class Evil:
    """Unpickling this creates ``marker``: the stand-in for an attacker's command."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.marker, "w"))


def make_state(seed: int = 0) -> TrainState:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    return TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))


def save_one(directory: Path, step: int = 5, seed: int = 0, **kw: object) -> TrainState:
    state = make_state(seed)
    with Checkpointer(directory, async_save=False, **kw) as ckpt:  # type: ignore[arg-type]
        ckpt.save(step, state)
    return state


def canonical(obj: dict) -> bytes:
    return (json.dumps(obj, sort_keys=True, indent=1, allow_nan=False) + "\n").encode()


def forge(folder: Path, edit) -> None:  # type: ignore[no-untyped-def]
    """Rewrite ``folder``'s manifest with ``edit`` and a matching CRC, as anyone could."""
    body = json.loads((folder / "manifest.json").read_bytes())
    body.pop("manifest_crc32")
    edit(body)
    body["manifest_crc32"] = f"{zlib.crc32(canonical(body)) & 0xFFFFFFFF:08x}"
    (folder / "manifest.json").write_bytes(canonical(body))


def list_file(body: dict, folder: Path, name: str) -> None:
    data = (folder / name).read_bytes()
    body["files"][name] = {
        "crc32": f"{zlib.crc32(data) & 0xFFFFFFFF:08x}",
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
    }


def rekind(folder: Path, marker: Path, keep_signature: bool) -> None:
    (folder / ".metadata").write_bytes(pickle.dumps(Evil(marker)))

    def edit(body: dict) -> None:
        body["kind"], body["sharded"] = "dcp", True
        list_file(body, folder, ".metadata")
        if not keep_signature:
            body.pop("signature", None)

    forge(folder, edit)


@pytest.mark.parametrize("keep_signature", [True, False], ids=["signature-kept", "signature-dropped"])
def test_a_rekinded_manifest_with_a_pickle_in_metadata_runs_no_code(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, keep_signature: bool
) -> None:
    marker = tmp_path / "attacker-ran"
    save_one(tmp_path / "ckpt")
    rekind(list_checkpoints(tmp_path / "ckpt")[-1].path, marker, keep_signature)
    with caplog.at_level(logging.WARNING), Checkpointer(tmp_path / "ckpt", async_save=False) as ckpt:
        assert ckpt.resume(make_state(1)) == 0  # refused: nothing else to resume from
    assert not marker.exists()
    why = "signature does not verify" if keep_signature else "not signed"
    assert any(why in r.getMessage() for r in caplog.records)


def test_rewritten_weights_under_a_consistent_manifest_are_refused(tmp_path: Path) -> None:
    save_one(tmp_path / "ckpt", step=5, seed=0)
    saved = save_one(tmp_path / "ckpt", step=10, seed=0)
    folder = list_checkpoints(tmp_path / "ckpt")[-1].path
    payload = torch.load(folder / "state.pt", weights_only=True)
    payload["model"]["weight"].fill_(1e6)  # a backdoored model
    torch.save(payload, folder / "state.pt")
    forge(folder, lambda body: list_file(body, folder, "state.pt"))
    assert "signature does not verify" in verify(folder).reason
    state = make_state(1)
    with Checkpointer(tmp_path / "ckpt", async_save=False) as ckpt:
        assert ckpt.resume(state) == 5  # the older, untouched checkpoint
    assert torch.equal(state.module.weight, saved.module.weight)


def test_unsigned_checkpoints_are_refused_unless_the_user_opts_in(tmp_path: Path) -> None:
    save_one(tmp_path / "ckpt")
    folder = list_checkpoints(tmp_path / "ckpt")[-1].path
    forge(folder, lambda body: [body.pop("signature"), [f.pop("sha256") for f in body["files"].values()]])
    result = verify(folder)
    assert not result.ok and "TRAINGUARD_CHECKPOINT_ALLOW_UNSIGNED=1" in result.reason
    with Checkpointer(tmp_path / "ckpt", async_save=False) as ckpt:
        assert ckpt.resume(make_state(1)) == 0
    with Checkpointer(tmp_path / "ckpt", async_save=False, allow_unsigned=True) as ckpt:
        assert ckpt.resume(make_state(1)) == 5
    assert verify(folder, trust=Trust(Keyring(()), allow_unsigned=True)).ok


def test_a_replicated_manifest_pins_the_loader_even_beside_a_metadata_pickle(tmp_path: Path) -> None:
    marker = tmp_path / "attacker-ran"
    save_one(tmp_path / "ckpt")
    folder = list_checkpoints(tmp_path / "ckpt")[-1].path
    (folder / ".metadata").write_bytes(pickle.dumps(Evil(marker)))  # the manifest untouched
    with Checkpointer(tmp_path / "ckpt", async_save=False) as ckpt:
        assert ckpt.resume(make_state(1)) == 5
    assert not marker.exists()


def sharded_checkpoint(directory: Path, extra: object = None) -> Path:
    """A signed sharded checkpoint written by our own sharded save, at world size 1."""
    from trainguard.torch import sharded

    state = make_state(0)
    if extra is not None:
        state.extra["note"] = extra
    with Checkpointer(directory, async_save=False) as ckpt:
        sharded.save(ckpt, 7, state)
    return list_checkpoints(directory)[-1].path


def test_a_sharded_checkpoint_resumes_through_the_safe_loader(tmp_path: Path) -> None:
    folder = sharded_checkpoint(tmp_path / "ckpt")
    assert verify(folder).ok and verify(folder).signed
    with Checkpointer(tmp_path / "ckpt", async_save=False) as ckpt:
        assert ckpt.resume(make_state(1)) == 7


def test_a_sharded_checkpoint_with_a_file_it_does_not_list_is_refused(tmp_path: Path) -> None:
    folder = sharded_checkpoint(tmp_path / "ckpt")
    (folder / "__9_0.distcp").write_bytes(b"planted")
    assert "__9_0.distcp is not in the manifest" in verify(folder).reason


def test_metadata_swapped_after_verification_is_refused_before_it_is_unpickled(tmp_path: Path) -> None:
    from trainguard.checkpoint import decode_manifest
    from trainguard.torch import sharded

    marker = tmp_path / "attacker-ran"
    folder = sharded_checkpoint(tmp_path / "ckpt")
    manifest = verify(folder).manifest
    assert manifest is not None and manifest == decode_manifest((folder / "manifest.json").read_bytes())
    (folder / ".metadata").write_bytes(pickle.dumps(Evil(marker)))  # between the check and the load
    with pytest.raises(CheckpointCorrupt, match="changed after the checkpoint was verified"):
        sharded.load(folder, make_state(1), manifest)
    assert not marker.exists()


def test_the_metadata_unpickler_builds_metadata_and_refuses_everything_else(tmp_path: Path) -> None:
    from trainguard.torch.dcp_safe import load_metadata

    marker = tmp_path / "attacker-ran"
    folder = sharded_checkpoint(tmp_path / "ckpt")
    assert load_metadata((folder / ".metadata").read_bytes()).state_dict_metadata
    with pytest.raises(CheckpointCorrupt, match=r"may not name io\.open"):
        load_metadata(pickle.dumps(Evil(marker)))
    assert not marker.exists()


def test_a_pickle_among_a_sharded_checkpoints_values_is_not_run(tmp_path: Path) -> None:
    """Signed by the user's own key (a poisoned ``extra`` that was saved): non-tensor values load
    with weights_only, as torch's own default planner does not."""
    marker = tmp_path / "attacker-ran"
    save_dir = tmp_path / "ckpt"
    folder = sharded_checkpoint(save_dir, extra=Evil(marker))
    assert verify(folder).ok and not marker.exists()
    with Checkpointer(save_dir, async_save=False) as ckpt, pytest.raises(CheckpointError):
        ckpt.resume(make_state(1))
    assert not marker.exists()


def test_a_failed_sharded_load_is_a_checkpoint_error_not_torchs_base_exception(tmp_path: Path) -> None:
    from trainguard.torch import sharded

    folder = sharded_checkpoint(tmp_path / "ckpt")
    manifest = verify(folder).manifest
    assert manifest is not None
    torch.manual_seed(0)
    wider = torch.nn.Linear(4, 5)  # other shapes: torch raises CheckpointException (a BaseException)
    with pytest.raises(CheckpointError, match="could not load sharded checkpoint"):
        sharded.load(folder, TrainState(wider, torch.optim.SGD(wider.parameters(), lr=0.1)), manifest)


def test_the_first_save_makes_a_private_key_and_a_world_readable_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.delenv(KEY_FILE_ENV)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    assert load_keyring().keys == ()  # reading never makes one
    save_one(tmp_path / "ckpt")
    key = home / ".config" / "trainguard" / "checkpoint.key"
    assert key.stat().st_mode & 0o777 == 0o600
    assert verify(list_checkpoints(tmp_path / "ckpt")[-1].path).signed
    key.chmod(0o644)
    with pytest.raises(ConfigError, match=f"chmod 600 {key}"):
        load_keyring()


def test_a_rotated_key_still_verifies_what_it_signed_until_it_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_FILE_ENV, str(tmp_path / "keys" / "checkpoint.key"))
    save_one(tmp_path / "ckpt", step=5)
    path = Path(os.environ[KEY_FILE_ENV])
    old = load_keyring().signing
    new = rotate(path)
    assert load_keyring().signing == new and load_keyring().find(old.id) == old
    save_one(tmp_path / "ckpt", step=10)
    first, second = (c.path for c in list_checkpoints(tmp_path / "ckpt"))
    assert verify(first).ok and verify(second).ok
    path.write_text(new.secret.hex() + "\n")  # the old key retired
    assert f"signed with key {old.id}, which is not in" in verify(first).reason
    assert verify(second).ok


def test_the_key_never_appears_on_the_writer_process_command_line(tmp_path: Path) -> None:
    state = make_state(0)
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        ckpt.save(5, state)
        ckpt.wait()
        writer = ckpt._writer
        assert writer is not None and writer._proc is not None
        cmdline = Path(f"/proc/{writer._proc.pid}/cmdline").read_bytes()
    assert load_keyring().signing.secret.hex().encode() not in cmdline
    assert verify(list_checkpoints(tmp_path / "ckpt")[-1].path).signed
