"""Low findings of issue 34 about where secrets and state go: a database password on the command
line by any flag, passwords with '#' in messages, a libpq key=value string taken for a file
name, the fleet breaker's empty reason, its file's shape, and private spool and lock files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainguard.cli import main
from trainguard.errors import ConfigError, StoreError
from trainguard.incidents.backend import check_cli_target, mask_url, open_backend
from trainguard.incidents.spool import Spool
from trainguard.remediate.breaker import BreakerFile, admit
from trainguard.remediate.policy import BreakerLimits

SECRET = "s3cr#et/pw"


def test_a_password_in_set_agent_db_is_refused_like_one_in_db(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"postgresql://tg:{SECRET}@127.0.0.1:1/fleet"
    code = main(["agent", "--backend", "sim", "--set", f"agent.db={url}", "--state-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code != 0 and "a password on the command line" in err and SECRET not in err


@pytest.mark.parametrize(
    "target",
    [f"postgresql://tg:{SECRET}@db/fleet", f"host=db user=tg password={SECRET} dbname=fleet"],
)
def test_passwords_with_odd_characters_are_masked_and_refused(target: str) -> None:
    assert SECRET not in mask_url(target) and "***" in mask_url(target)
    with pytest.raises(ConfigError) as err:
        check_cli_target(target)
    assert SECRET not in str(err.value)


def test_a_keyword_connection_string_is_not_a_sqlite_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="postgresql://") as err:
        open_backend(f"host=db user=tg password={SECRET} dbname=fleet")
    assert SECRET not in str(err.value)
    assert list(tmp_path.iterdir()) == []  # no file named after it, password and all


def test_an_empty_breaker_reason_holds_actions_as_it_shows(tmp_path: Path) -> None:
    path = tmp_path / "breaker.json"
    path.write_text(json.dumps({"tripped": ""}))
    state = BreakerFile(path).load()
    assert state.tripped  # shown open...
    ok, why, _ = admit(state, BreakerLimits(), "n1", None, 0.0, 0)
    assert not ok and "fleet breaker open" in why  # ...and open


@pytest.mark.parametrize("content", ["null", "[]", '"open"'])
def test_a_breaker_file_of_the_wrong_shape_is_a_clear_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "breaker.json"
    path.write_text(content)
    with pytest.raises(StoreError, match="not an object"):
        BreakerFile(path).load()


def test_spool_and_lock_files_are_private(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool.jsonl")
    spool.append({"op": "add", "incident": {"summary": "Xid 79"}})
    with BreakerFile(tmp_path / "breaker.json").update() as box:
        box[0] = box[0]
    for name in ("spool.jsonl", "breaker.json.lock"):
        assert (tmp_path / name).stat().st_mode & 0o077 == 0, name
