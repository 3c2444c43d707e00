"""Checkpoints encrypted at rest (``Checkpointer(encrypt=True)``, AES-256-GCM through
``cryptography``): exact round trips, nothing readable on disk, tampering refused."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest
import torch

from real_parts import require_module
from trainguard.checkpoint import list_checkpoints, verify
from trainguard.checkpoint.signing import Keyring, load_keyring
from trainguard.errors import CheckpointCorrupt, CheckpointError
from trainguard.torch import Checkpointer, TrainState, loading

require_module("cryptography", install="pip install 'trainguard[encrypt]' (make install does)")

PATTERN = 1234.5678  # a weight value whose bytes would show in a plaintext file


def make_state(seed: int = 0, width: int = 300) -> TrainState:
    torch.manual_seed(seed)
    model = torch.nn.Linear(width, width)
    with torch.no_grad():
        model.weight.fill_(PATTERN)
        model.bias.normal_()
    return TrainState(model, torch.optim.Adam(model.parameters(), lr=0.1))


def train(state: TrainState) -> None:
    state.module(torch.randn(2, state.module.in_features)).square().mean().backward()
    state.optimizer.step()
    state.optimizer.zero_grad()


# async: a writer process starts (seconds): in make test-all
@pytest.mark.parametrize(
    "async_save", [pytest.param(True, marks=pytest.mark.slow), False], ids=["async", "sync"]
)
def test_an_encrypted_checkpoint_resumes_exactly_and_shows_nothing_on_disk(
    tmp_path: Path, async_save: bool
) -> None:
    saved = make_state(0)
    train(saved)
    with Checkpointer(tmp_path / "ckpt", async_save=async_save, encrypt=True) as ckpt:
        ckpt.save(3, saved)
    folder = list_checkpoints(tmp_path / "ckpt")[-1].path
    result = verify(folder)
    assert result.ok and result.manifest is not None
    assert result.manifest.files["state.pt"].sealed is not None
    on_disk = (folder / "state.pt").read_bytes()
    assert torch.tensor([PATTERN]).numpy().tobytes() not in on_disk
    assert b"PK\x03\x04" not in on_disk[:64]  # not a torch.save zip archive
    restored = make_state(1)
    with Checkpointer(tmp_path / "ckpt", async_save=async_save) as ckpt:
        assert ckpt.resume(restored) == 3
    for a, b in zip(saved.module.state_dict().values(), restored.module.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(
        saved.optimizer.state_dict()["state"][0]["exp_avg"],
        restored.optimizer.state_dict()["state"][0]["exp_avg"],
    )


def test_a_piece_changed_after_verification_fails_to_decrypt(tmp_path: Path) -> None:
    with Checkpointer(tmp_path / "ckpt", async_save=False, encrypt=True) as ckpt:
        ckpt.save(3, make_state(0))
    folder = list_checkpoints(tmp_path / "ckpt")[-1].path
    manifest = verify(folder).manifest
    assert manifest is not None
    data = bytearray((folder / "state.pt").read_bytes())
    data[len(data) // 2] ^= 0x01
    (folder / "state.pt").write_bytes(bytes(data))
    with pytest.raises(CheckpointCorrupt, match="piece 0 does not decrypt"):
        loading.load_payload(folder, manifest, True, load_keyring)


def test_a_rank_without_the_key_is_told_which_key_and_where_to_put_it(tmp_path: Path) -> None:
    with Checkpointer(tmp_path / "ckpt", async_save=False, encrypt=True) as ckpt:
        ckpt.save(3, make_state(0))
    folder = list_checkpoints(tmp_path / "ckpt")[-1].path
    manifest = verify(folder).manifest
    assert manifest is not None and manifest.signature is not None
    with pytest.raises(CheckpointError, match=f"encrypted with key {manifest.signature.key_id}.*KEY_FILE"):
        loading.load_payload(folder, manifest, True, lambda: Keyring((), "/elsewhere/checkpoint.key"))


def test_encrypting_sharded_state_is_refused_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainguard.torch import sharded

    monkeypatch.setattr(sharded, "is_sharded", lambda state: True)
    with (
        Checkpointer(tmp_path / "ckpt", async_save=False, encrypt=True) as ckpt,
        pytest.raises(CheckpointError, match="replicated checkpoints only"),
    ):
        ckpt.save(3, make_state(0))


def test_the_sealing_example_runs() -> None:
    module = importlib.import_module("trainguard.checkpoint.sealing")
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
