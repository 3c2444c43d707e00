"""`SupervisorConfig.to_argv` rebuilds the config through `trainguard run`'s own parser, for every
flag: the replica loop starts each group with it, so a flag it loses is an option the groups
silently run without. The flags are enumerated from the parser: a new flag with no entry here
fails `test_every_flag_of_trainguard_run_has_a_round_trip_case`."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")  # torchrun's options are read by torchrun's parser

from trainguard.cli import build_parser
from trainguard.cli.run import config_from_args
from trainguard.supervisor.config import SupervisorConfig

COMMAND = ["--", "python", "train.py", "--lr", "0.1"]
TOML = "[thresholds]\nxid_hold_s = 60\npcie_replay_per_min = 12\n"

# option -> (its non-default use, the command, the argv it must differ from)
CASES: dict[str, tuple[list[str], list[str], list[str]]] = {
    "--nnodes": (["--nnodes", "1:2"], COMMAND, []),
    "--nproc-per-node": (["--nproc-per-node", "3"], COMMAND, []),
    "--rdzv-backend": (["--rdzv-backend", "c10d"], COMMAND, []),
    "--rdzv-endpoint": (["--rdzv-endpoint", "10.0.0.1:29400"], COMMAND, []),
    "--rdzv-id": (["--rdzv-id", "job7"], COMMAND, []),
    "--rdzv-conf": (["--rdzv-conf", "join_timeout=60"], COMMAND, []),
    "--standalone": (["--standalone", "--nnodes", "2"], COMMAND, ["--nnodes", "2"]),
    "--spare": (
        ["--spare", "--nnodes", "2", "--rdzv-endpoint", "h:1"],
        COMMAND,
        ["--nnodes", "2", "--rdzv-endpoint", "h:1"],
    ),
    "--monitor-interval": (["--monitor-interval", "0.25"], COMMAND, []),
    "--start-method": (["--start-method", "fork"], COMMAND, []),
    "--event-log-handler": (["--event-log-handler", "console"], COMMAND, []),
    "--role": (["--role", "trainer"], COMMAND, []),
    "-m": (["-m"], ["pkg.train", "--lr", "0.1"], []),
    "--no-python": (["--no-python"], ["--", "train.py", "--lr", "0.1"], ["--", "train.py", "--lr", "0.1"]),
    "--duplicate-stdout-filters": (["--duplicate-stdout-filters", "0,1"], COMMAND, []),
    "--duplicate-stderr-filters": (["--duplicate-stderr-filters", "1"], COMMAND, []),
    "--node-rank": (["--node-rank", "1"], COMMAND, []),
    "--master-addr": (["--master-addr", "10.0.0.2"], COMMAND, []),
    "--master-port": (["--master-port", "29600"], COMMAND, []),
    "--local-addr": (["--local-addr", "10.0.0.3"], COMMAND, []),
    "--numa-binding": (["--numa-binding", "node"], COMMAND, []),
    "--signals-to-handle": (["--signals-to-handle", "SIGTERM"], COMMAND, []),
    "--shutdown-timeout": (["--shutdown-timeout", "15"], COMMAND, []),
    "--virtual-local-rank": (["--virtual-local-rank"], COMMAND, []),
    "--max-restarts": (["--max-restarts", "7"], COMMAND, []),
    "--launcher": (["--launcher", "local"], COMMAND, []),
    "--job-id": (["--job-id", "j1"], COMMAND, []),
    "--runs-dir": (["--runs-dir", "/tmp/elsewhere"], COMMAND, []),
    "--db": (["--db", "/tmp/tg.db"], COMMAND, []),
    "--checkpoint-dir": (["--checkpoint-dir", "/tmp/ckpt"], COMMAND, []),
    "--hang-timeout-floor": (["--hang-timeout-floor", "12.5"], COMMAND, []),
    "--hang-step-factor": (["--hang-step-factor", "3"], COMMAND, []),
    "--startup-timeout": (["--startup-timeout", "90"], COMMAND, []),
    "--idle-timeout": (["--idle-timeout", "0"], COMMAND, []),
    "--backend": (["--backend", "sim"], COMMAND, []),
    "--no-preflight": (["--no-preflight"], COMMAND, []),
    "--kernel-log": (["--kernel-log", "/tmp/kern.log"], COMMAND, []),
    "--health-interval": (["--health-interval", "0.75"], COMMAND, []),
    "--agent-url": (["--agent-url", "https://node7:9410"], COMMAND, []),
    "--agent-token-file": (["--agent-token-file", "/tmp/agent.token"], COMMAND, []),
    "--config": (["--config", "{toml}"], COMMAND, []),
    "--set": (
        ["--set", "thresholds.pcie_replay_per_min=20", "--set", "thresholds.app_xids=13,31"],
        COMMAND,
        [],
    ),
    "--chaos": (["--chaos", "/tmp/plan.toml"], COMMAND, []),
    "--crash-loop-after": (["--crash-loop-after", "5"], COMMAND, []),
    "--backoff-base": (["--backoff-base", "2.5"], COMMAND, []),
    "--backoff-max": (["--backoff-max", "30"], COMMAND, []),
    "--kill-grace": (["--kill-grace", "5"], COMMAND, []),
    "--preemption-exit-code": (["--preemption-exit-code", "42"], COMMAND, []),
    "--min-nproc": (["--min-nproc", "2"], COMMAND, []),
    "--gpu-ids": (["--gpu-ids", "2,3"], COMMAND, []),
    "--replica-groups": (["--replica-groups", "2"], COMMAND, []),
    "--replica-group-id": (
        ["--replica-groups", "2", "--replica-group-id", "1", "--lighthouse", "http://lh:29510"],
        COMMAND,
        ["--replica-groups", "2"],
    ),
    "--lighthouse": (
        ["--replica-groups", "2", "--replica-group-id", "0", "--lighthouse", "http://lh:29510"],
        COMMAND,
        ["--replica-groups", "2", "--replica-group-id", "0", "--lighthouse", "http://other:29510"],
    ),
    "--warm-standby": (["--no-warm-standby"], COMMAND, []),
    "--warm-standby-sets": (["--warm-standby-sets", "1"], COMMAND, []),
    "--warm-standby-preload": (["--warm-standby-preload", "torch,numpy"], COMMAND, []),
    "--warm-refill-delay": (["--warm-refill-delay", "30"], COMMAND, []),
    "--warm-refill-nice": (["--warm-refill-nice", "0"], COMMAND, []),
    "--warm-fill-at-start": (["--warm-fill-at-start"], COMMAND, []),
    "--no-tee": (["--no-tee"], COMMAND, []),
    "--json": (["--json", "/tmp/result.json"], COMMAND, []),
    "cmd": ([], ["--", "python", "other.py"], []),
    # mpirun's options (--launcher mpirun), kept as written
    "-np": (["--launcher", "mpirun", "-np", "4"], COMMAND, ["--launcher", "mpirun"]),
    "-H": (["--launcher", "mpirun", "--host", "n1:2,n2:2"], COMMAND, ["--launcher", "mpirun"]),
    "-hostfile": (["--launcher", "mpirun", "--hostfile", "{hostfile}"], COMMAND, ["--launcher", "mpirun"]),
    "-x": (["--launcher", "mpirun", "-x", "NCCL_DEBUG"], COMMAND, ["--launcher", "mpirun"]),
    "-mca": (["--launcher", "mpirun", "--mca", "btl", "self,tcp"], COMMAND, ["--launcher", "mpirun"]),
    "--map-by": (["--launcher", "mpirun", "--bind-to", "core"], COMMAND, ["--launcher", "mpirun"]),
    "--cpus-per-proc": (["--launcher", "mpirun", "--timeout", "600"], COMMAND, ["--launcher", "mpirun"]),
    "--oversubscribe": (["--launcher", "mpirun", "--oversubscribe"], COMMAND, ["--launcher", "mpirun"]),
    # srun's (--launcher srun), kept as written
    "--ntasks": (
        ["--launcher", "srun", "--ntasks", "4", "--mpi=pmix", "-w", "tg[1-2]", "--exclude=tg3"],
        COMMAND,
        ["--launcher", "srun"],
    ),
    "-O": (["--launcher", "srun", "-O", "--label"], COMMAND, ["--launcher", "srun"]),
    "--launcher-arg": (
        ["--launcher", "mpirun", "--launcher-arg=--display-devel-map"],
        COMMAND,
        ["--launcher", "mpirun"],
    ),
}
# Accepted and without effect on what runs, by design: trainguard writes worker output to the run
# directory (it says so), and --run-path runs the script as `python -u` does.
NO_EFFECT = {"--log-dir", "-r", "-t", "--local-ranks-filter", "--logs-specs", "--run-path"}
REFUSED = {"--gpus"}  # --gpu-ids' former spelling: refused, naming the fix (test_actions.py)


def _run_parser():
    parser = build_parser("run")
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices["run"]


def _flags() -> list[str]:
    return [
        a.option_strings[0] if a.option_strings else a.dest
        for a in _run_parser()._actions
        if a.dest != "help"
    ]


def config_of(argv: list[str]) -> SupervisorConfig:
    return config_from_args(build_parser("run").parse_args(["run", *argv]))


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith(("TRAINGUARD_", "PET_")):
            monkeypatch.delenv(key)


def test_every_flag_of_trainguard_run_has_a_round_trip_case():
    assert set(_flags()) == set(CASES) | NO_EFFECT | REFUSED


@pytest.mark.parametrize("flag", sorted(CASES))
def test_a_flag_survives_to_argv_and_the_cli_parser(flag, tmp_path):
    options, command, base = CASES[flag]
    toml = tmp_path / "trainguard.toml"
    toml.write_text(TOML)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n1 slots=2\nn2 slots=2\n")
    options = [str(toml) if o == "{toml}" else str(hostfile) if o == "{hostfile}" else o for o in options]
    config = config_of([*options, *command])
    assert config != config_of([*base, *COMMAND]), f"{flag} changed nothing in the config"
    assert config_of(config.to_argv()) == config


@pytest.mark.parametrize("flag", sorted(NO_EFFECT))
def test_the_flags_that_do_not_apply_change_nothing(flag):
    if flag == "--run-path":  # takes torchrun's script form
        script = ["train.py", "--lr", "0.1"]
        assert config_of([flag, *script]) == config_of(script)
    else:
        assert config_of([flag, "x", *COMMAND]) == config_of(COMMAND)


def test_a_setting_back_at_its_default_over_the_file_is_kept(tmp_path):
    # The file raises xid_hold_s; --set puts it back to the default. A group that got only the
    # non-default thresholds would take the file's value.
    toml = tmp_path / "trainguard.toml"
    toml.write_text(TOML)
    config = config_of(["--config", str(toml), "--set", "thresholds.xid_hold_s=86400", *COMMAND])
    assert config.health.thresholds is not None and config.health.thresholds.xid_hold_s == 86400
    assert config_of(config.to_argv()) == config


def test_a_command_that_starts_with_a_script_stays_a_command():
    config = config_of(["--no-python", "--", "run.py", "--epochs", "2"])
    assert config.launch.cmd == ("run.py", "--epochs", "2")
    assert config_of(config.to_argv()).launch.cmd == ("run.py", "--epochs", "2")


def test_a_replica_groups_command_line_carries_the_jobs_options(tmp_path):
    """What `group_argv` used to drop: the kernel log, the node agent, the settings file."""
    from trainguard.supervisor.replicas import ReplicaConfig, group_config

    toml = tmp_path / "trainguard.toml"
    toml.write_text(TOML)
    job = config_of(
        [
            "--replica-groups", "2", "--kernel-log", "/var/log/kern.log", "--agent-url", "https://n:9410",
            "--agent-token-file", "/etc/tg/token", "--config", str(toml), "--set", "thresholds.app_xids=13",
            "--health-interval", "0.75", *COMMAND,
        ]
    )  # fmt: skip
    group = group_config(job, ReplicaConfig(), "g1", (1,), tmp_path, tmp_path / "g1.json", None)
    rebuilt = config_of(group.to_argv())
    assert rebuilt == group and rebuilt.replica_groups == 0
    assert rebuilt.health == job.health  # kernel log, agent, settings file, thresholds, interval
    assert (rebuilt.launch.gpus, rebuilt.record.result_file) == ((1,), tmp_path / "g1.json")


def test_every_start_of_a_group_uses_the_run_directory_the_replica_loop_reads(tmp_path, monkeypatch):
    # A job id from the clock (no --job-id, no --rdzv-id): a group (re)started a second later
    # must not get a run directory of its own, where the loop would never see its steps.
    import time

    from trainguard.supervisor.replicas import ReplicaConfig, ReplicaSupervisor, group_config

    ticks = iter(f"job-{n}" for n in range(100))
    monkeypatch.setattr(time, "strftime", lambda fmt, *a: next(ticks))
    job = config_of(["--runs-dir", str(tmp_path / "runs"), "--db", str(tmp_path / "tg.db"), *COMMAND])
    sup = ReplicaSupervisor(job, ReplicaConfig(groups=2))
    for g in sup.groups:
        group = group_config(sup.config, sup.replicas, g.name, g.gpus, sup.run_dir, tmp_path / "r.json", None)
        assert group.record.runs_root / group.record.job_id == sup.group_dir(g)


@pytest.mark.parametrize(
    "extra",
    [["--standalone", "--nnodes", "2"], ["--launcher", "local"], ["--replica-groups", "2", "--nnodes", "2"]],
)
def test_a_spare_without_a_multi_node_rendezvous_is_refused_with_the_fix(extra):
    from trainguard.errors import ConfigError

    with pytest.raises(ConfigError, match=r"--spare: .* --rdzv-endpoint"):
        config_of(["--spare", *extra, *COMMAND])
