"""`trainguard run` is a drop-in for torchrun: every invocation torchrun accepts is accepted and
resolves to the launch torchrun's own code resolves it to (torch.distributed.run's parser and
``run()``), the worker command included. trainguard's only difference is its restart budget (3
when --max-restarts is not given)."""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch_run = pytest.importorskip("torch.distributed.run")

# torchrun's options and script, as a user would type them after `torchrun`.
INVOCATIONS = [
    ["--nproc-per-node", "2", "train.py"],
    ["--nproc_per_node=2", "train.py", "--lr", "0.1", "--nproc-per-node", "9"],
    ["train.py"],
    ["--nproc-per-node", "2", "--master-port", "29533", "train.py"],
    ["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "1234", "train.py"],
    ["--nnodes", "2", "--nproc-per-node", "4", "train.py"],
    ["--nnodes", "2", "--rdzv-endpoint", "10.0.0.1:29400", "train.py"],
    [
        "--nnodes",
        "1:4",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "h:29400",
        "--rdzv-id",
        "job7",
        "train.py",
    ],
    ["--nnodes=1:2", "--rdzv_backend=c10d", "--rdzv_endpoint=h:1", "--rdzv_conf=join_timeout=60", "train.py"],
    ["--standalone", "--nproc-per-node", "cpu", "train.py"],
    ["--standalone", "--nproc-per-node", "auto", "-m", "pkg.train", "--epochs", "3"],
    ["--no-python", "--nproc-per-node", "2", "./train.sh", "x"],
    ["--run-path", "train.py", "a"],
    ["--max-restarts", "5", "--monitor-interval", "1", "train.py"],
    ["--start-method", "fork", "--role", "trainer", "--event-log-handler", "null", "train.py"],
    ["--local-addr", "127.0.0.1", "--signals-to-handle", "SIGTERM", "--shutdown-timeout", "7", "train.py"],
    ["--virtual-local-rank", "--duplicate-stdout-filters", "a,,b,c", "train.py"],
    ["--log-dir", "/tmp/logs", "-r", "3", "-t", "3", "--local-ranks-filter", "0", "train.py"],
    ["--", "train.py", "--flag"],
]


def _torchrun(argv: list[str], monkeypatch) -> tuple[object, list[str]]:
    """What torchrun itself would launch: its run(), stopped where it would start the agent."""
    seen: dict[str, object] = {}

    class Capture:
        def __init__(self, config, entrypoint):
            seen["config"], seen["entrypoint"] = config, entrypoint

        def __call__(self, *args):
            seen["args"] = list(args)

    monkeypatch.setattr(torch_run, "elastic_launch", Capture)
    torch_run.run(torch_run.parse_args(argv))
    entry = seen["entrypoint"]
    # --run-path: the script is run in the worker as `python -u script` runs it
    return seen["config"], [sys.executable, "-u", *seen["args"]] if callable(entry) else [
        entry,
        *seen["args"],
    ]


def _trainguard(argv: list[str]) -> tuple[object, list[str]]:
    """What `trainguard run ARGV` launches: its config, its torchrun command line, torchrun's parser."""
    from trainguard.cli import build_parser
    from trainguard.cli.run import config_from_args
    from trainguard.supervisor.elastic import launch_config
    from trainguard.supervisor.torchrun import torchrun_argv

    cfg = config_from_args(build_parser().parse_args(["run", *argv]))
    config, entry, args = launch_config(torchrun_argv(cfg, "job"))
    return config, [entry, *args]


def _fields(config: object) -> dict[str, object]:
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}  # type: ignore[arg-type]


@pytest.mark.parametrize("argv", INVOCATIONS, ids=" ".join)
def test_trainguard_run_resolves_every_torchrun_invocation_as_torchrun_does(argv, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # torchrun sets it in its own process otherwise
    theirs, their_cmd = _torchrun(argv, monkeypatch)
    ours, our_cmd = _trainguard(argv)
    assert our_cmd == their_cmd
    mine, them = _fields(ours), _fields(theirs)
    # Output goes to trainguard's run directory (its own LogsSpecs), and the restart budget is its own.
    for name in ("logs_specs", "max_restarts"):
        mine.pop(name), them.pop(name)
    if len(str(them["run_id"])) == 36:  # torchrun's private rendezvous: a fresh uuid each time
        assert mine["run_id"] == "job"
        mine.pop("run_id"), them.pop("run_id")
    assert mine == them
    given = "--max-restarts" in argv
    assert ours.max_restarts == (theirs.max_restarts if given else 3)  # type: ignore[attr-defined]


def test_a_single_node_without_rendezvous_options_runs_as_torchrun_runs_it(monkeypatch):
    # What `trainguard run --nproc-per-node 2 -- python train.py` used to refuse.
    ours, cmd = _trainguard(["--nproc-per-node", "2", "--", "python", "train.py"])
    assert cmd == ["python", "train.py"]
    assert (ours.rdzv_backend, ours.rdzv_endpoint, ours.nproc_per_node) == ("c10d", "localhost:0", 2)  # type: ignore[attr-defined]
    two_nodes, _ = _trainguard(["--nnodes", "2", "--", "python", "train.py"])
    assert (two_nodes.rdzv_backend, two_nodes.rdzv_endpoint) == ("static", "127.0.0.1:29500")  # type: ignore[attr-defined]


def test_torchrun_environment_variables_apply_as_under_torchrun(monkeypatch):
    monkeypatch.setenv("PET_NPROC_PER_NODE", "3")
    monkeypatch.setenv("PET_NNODES", "2")
    monkeypatch.setenv("PET_MASTER_PORT", "29777")
    ours, _ = _trainguard(["train.py"])
    theirs, _ = _torchrun(["train.py"], monkeypatch)
    assert (ours.nproc_per_node, ours.rdzv_endpoint) == (3, "127.0.0.1:29777")  # type: ignore[attr-defined]
    assert (theirs.nproc_per_node, theirs.rdzv_endpoint) == (3, "127.0.0.1:29777")  # type: ignore[attr-defined]


def test_trainguard_run_has_every_torchrun_option():
    from trainguard.cli import build_parser

    run = build_parser()._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    ours = {s for a in run._actions for s in a.option_strings}
    theirs = {s for a in torch_run.get_args_parser()._actions for s in a.option_strings}
    assert theirs - ours == set()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--start-method", "thread", "train.py"], "start-method"),
        (["--nproc-per-node", "many", "train.py"], "many"),
        (["-m", "--no-python", "pkg"], "either -m"),
        (["--nproc-per-node", "2"], "no worker command"),
    ],
)
def test_what_torchrun_refuses_is_a_usage_error(argv, message):
    from trainguard.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        _trainguard(argv)


WORKER = """
import json, os, sys
import torch.distributed as dist
dist.init_process_group("gloo")
t = __import__("torch").ones(1)
dist.all_reduce(t)
out = {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
out["sum"] = t.item()
open(os.path.join(sys.argv[1], f"rank{out['RANK']}.json"), "w").write(json.dumps(out))
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
@pytest.mark.parametrize("rendezvous", ["default", "static"])
def test_trainguard_run_starts_what_torchrun_starts_without_standalone(tmp_path, rendezvous):
    # "default": torchrun's private rendezvous on a free port; "static": an explicit free port
    # (never 29500, which another run on this machine may hold).
    (tmp_path / "worker.py").write_text(WORKER)
    out = tmp_path / "out"
    out.mkdir()
    flags = ["--nproc-per-node", "2"]
    if rendezvous == "static":
        flags = ["--nnodes", "1", "--master-port", str(port := _free_port()), *flags]
    args = [sys.executable, "-m", "trainguard.cli", "run", *flags, "--no-warm-standby", "--no-tee"]
    args += ["--db", str(tmp_path / "tg.db"), "--runs-dir", str(tmp_path / "runs")]
    args += ["--", sys.executable, str(tmp_path / "worker.py"), str(out)]
    done = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = [json.loads(p.read_text()) for p in sorted(Path(out).glob("rank*.json"))]
    assert [(s["RANK"], s["WORLD_SIZE"], s["sum"]) for s in seen] == [("0", "2", 2.0), ("1", "2", 2.0)]
    if rendezvous == "static":
        assert {(s["MASTER_ADDR"], s["MASTER_PORT"]) for s in seen} == {("127.0.0.1", str(port))}
