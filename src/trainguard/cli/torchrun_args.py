"""torchrun's command line, read by torchrun's own parser: what makes `trainguard run` a drop-in.

`trainguard run` takes every torchrun option (``TORCHRUN_OPTIONS`` lists them; a test checks the
list against ``torch.distributed.run.get_args_parser``), collects them as written, and hands them
to torchrun's parser, so defaults, ``PET_*`` environment variables and validation are torchrun's.
The rendezvous then follows torchrun's ``run()``: ``--standalone``, and a single node with the
static default and no ``--master-port``, get a private c10d rendezvous on a free port; otherwise
the static rendezvous is on ``--master-addr:--master-port`` (127.0.0.1:29500 by default).

The worker command is torchrun's too: ``trainguard run [opts] train.py ARGS`` (or ``-- train.py``,
``-m pkg.mod``) runs ``python -u train.py ARGS``; ``--no-python CMD`` runs CMD; and trainguard's own
form, ``-- python train.py ARGS`` (a command line whose first word is not a ``.py`` file), is the
full command line, as torchrun's ``--no-python`` takes it. Imports torch (in ``resolve``); a
launcher that is not torch's (``--launcher local``) reads the few options that apply to it
without torch (``resolve_plain``).

    >>> split_command(["--", "python", "train.py"], [])
    (['python', 'train.py'], True)
    >>> split_command(["train.py", "--lr", "1"], [])
    (['train.py', '--lr', '1'], False)
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Any

from trainguard.errors import ConfigError, MissingDependency

__all__ = ["LOG_OPTIONS", "TORCHRUN_OPTIONS", "Launch", "resolve", "resolve_plain", "split_command"]

# (option strings, metavar; None: a flag), in torchrun's order. --max-restarts is trainguard's own
# option (its default is a restart budget of 3; torchrun's is 0).
TORCHRUN_OPTIONS: list[tuple[tuple[str, ...], str | None]] = [
    (("--nnodes",), "N|MIN:MAX"),
    (("--nproc-per-node", "--nproc_per_node"), "N|gpu|cpu|auto"),
    (("--rdzv-backend", "--rdzv_backend"), "BACKEND"),
    (("--rdzv-endpoint", "--rdzv_endpoint"), "HOST:PORT"),
    (("--rdzv-id", "--rdzv_id"), "ID"),
    (("--rdzv-conf", "--rdzv_conf"), "K=V,..."),
    (("--standalone",), None),
    (("--monitor-interval", "--monitor_interval"), "S"),
    (("--start-method", "--start_method"), "{spawn,fork,forkserver}"),
    (("--event-log-handler", "--event_log_handler"), "HANDLER"),
    (("--role",), "ROLE"),
    (("-m", "--module"), None),
    (("--no-python", "--no_python"), None),
    (("--run-path", "--run_path"), None),
    (("--log-dir", "--log_dir"), "DIR"),
    (("-r", "--redirects"), "STD"),
    (("-t", "--tee"), "STD"),
    (("--local-ranks-filter", "--local_ranks_filter"), "RANKS"),
    (("--duplicate-stdout-filters", "--duplicate_stdout_filters"), "FILTERS"),
    (("--duplicate-stderr-filters", "--duplicate_stderr_filters"), "FILTERS"),
    (("--node-rank", "--node_rank"), "N"),
    (("--master-addr", "--master_addr"), "HOST"),
    (("--master-port", "--master_port"), "PORT"),
    (("--local-addr", "--local_addr"), "HOST"),
    (("--logs-specs", "--logs_specs"), "NAME"),
    (("--numa-binding", "--numa_binding"), "MODE"),
    (("--signals-to-handle", "--signals_to_handle"), "SIGNALS"),
    (("--shutdown-timeout", "--shutdown_timeout"), "S"),
    (("--virtual-local-rank", "--virtual_local_rank"), None),
]
# Accepted, and said not to apply: worker output always goes to the run directory's log files
# (copied to the console unless --no-tee).
LOG_OPTIONS = ("log_dir", "redirects", "tee", "local_ranks_filter", "logs_specs")
_COMMAND_FLAGS = {"-m", "--module", "--no-python", "--no_python", "--run-path", "--run_path"}


class PassThrough(argparse.Action):
    """Collects a torchrun option as it was written, for torchrun's parser."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        given = list(getattr(namespace, self.dest, None) or [])
        given += [str(option_string)] + ([] if self.nargs == 0 else [str(values)])
        setattr(namespace, self.dest, given)


def add_torchrun_options(group: Any) -> None:
    for names, metavar in TORCHRUN_OPTIONS:
        if metavar is None:
            group.add_argument(*names, action=PassThrough, nargs=0, dest="torchrun_args", help="as torchrun")
        else:
            group.add_argument(
                *names, action=PassThrough, dest="torchrun_args", metavar=metavar, help="as torchrun"
            )


def split_command(words: list[str], tokens: list[str]) -> tuple[list[str], bool]:
    """(the words after the options, whether they are a full command line). After ``--``, a first
    word that is not a ``.py`` file is a full command line unless torchrun's -m / --no-python /
    --run-path says how to run it; without ``--`` the words are torchrun's script and its arguments."""
    explicit = bool(words) and words[0] == "--"
    words = words[1:] if explicit else list(words)
    full = explicit and bool(words) and not words[0].endswith(".py") and not _COMMAND_FLAGS & set(tokens)
    return words, full


@dataclass(frozen=True, slots=True)
class Launch:
    """What torchrun would run, as `SupervisorConfig` fields and torchrun options."""

    cmd: tuple[str, ...]
    nproc_per_node: int
    nnodes: str
    standalone: bool
    rdzv_backend: str
    rdzv_endpoint: str
    rdzv_id: str
    rdzv_conf: str
    max_restarts: int
    monitor_interval: float
    extra: tuple[str, ...]  # the other torchrun options, resolved
    ignored: tuple[str, ...]  # log options given that do not apply


def resolve(tokens: list[str], words: list[str], full_command: bool, max_restarts: int | None) -> Launch:
    """Parse ``tokens`` (torchrun options as written) and the worker ``words`` with torchrun's
    parser and resolve them as torchrun's ``run()`` does."""
    try:
        from torch.distributed.run import (
            determine_local_world_size,
            get_args_parser,
            get_rdzv_endpoint,
            parse_min_max_nnodes,
        )
    except ImportError as exc:
        raise MissingDependency(
            f"trainguard run reads torchrun's options with torch ({exc}): pip install 'trainguard[torch]'"
        ) from None

    if not words:
        raise ConfigError("no worker command: use `trainguard run [options] -- python train.py ...`")
    parser = get_args_parser()
    parser.prog = "trainguard run (torchrun's options)"
    parser.exit_on_error = False
    try:
        ns = parser.parse_args([*tokens, *(["--no-python"] if full_command else []), *words])
        min_nodes, max_nodes = parse_min_max_nnodes(ns.nnodes)
        nproc = determine_local_world_size(ns.nproc_per_node)
    except (argparse.ArgumentError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"torchrun's options: {exc}") from None
    except SystemExit:  # argparse printed what was wrong
        raise ConfigError("torchrun's options: see the error above") from None
    if ns.module and ns.no_python:
        raise ConfigError("give either -m (a module) or --no-python (a command), as torchrun")
    # torchrun's run(): a private rendezvous for --standalone, and for one node with no endpoint
    # and no --master-port; the static rendezvous on master_addr:master_port otherwise.
    standalone = bool(ns.standalone) or (
        ns.rdzv_backend == "static" and not ns.rdzv_endpoint and ns.master_port is None and max_nodes == 1
    )
    if ns.master_port is None:
        ns.master_port = 29500
    if ns.no_python:
        cmd = [ns.training_script, *ns.training_script_args]
    else:
        python = os.getenv("PYTHON_EXEC", sys.executable)
        cmd = [python, "-u", *(["-m"] if ns.module else []), ns.training_script, *ns.training_script_args]
    if max_restarts is None:  # trainguard's budget, unless torchrun's PET_MAX_RESTARTS sets one
        max_restarts = ns.max_restarts if "PET_MAX_RESTARTS" in os.environ else 3
    if min_nodes < 1 or max_restarts < 0:
        raise ConfigError(
            f"--nnodes {ns.nnodes} / --max-restarts {max_restarts}: need nodes >= 1, restarts >= 0"
        )
    extra = [
        "--start-method",
        ns.start_method,
        "--event-log-handler",
        ns.event_log_handler,
        "--role",
        ns.role,
    ]
    extra += ["--node-rank", str(ns.node_rank), "--master-addr", ns.master_addr]
    extra += ["--master-port", str(ns.master_port), "--signals-to-handle", ns.signals_to_handle]
    for flag, value in (
        ("--local-addr", ns.local_addr),
        ("--numa-binding", ns.numa_binding),
        ("--shutdown-timeout", ns.shutdown_timeout),
    ):
        if value is not None:
            extra += [flag, str(value)]
    for flag, items in (
        ("--duplicate-stdout-filters", ns.duplicate_stdout_filters),
        ("--duplicate-stderr-filters", ns.duplicate_stderr_filters),
    ):
        if items:
            extra += [flag, ",".join(item.replace(",", ",,") for item in items)]
    if ns.virtual_local_rank:
        extra.append("--virtual-local-rank")
    defaults = {"log_dir": None, "redirects": "0", "tee": "0", "local_ranks_filter": "", "logs_specs": None}
    ignored = tuple(f"--{k.replace('_', '-')}" for k in LOG_OPTIONS if getattr(ns, k) != defaults[k])
    return Launch(
        cmd=tuple(cmd),
        nproc_per_node=nproc,
        nnodes=ns.nnodes,
        standalone=standalone,
        rdzv_backend="c10d" if standalone else ns.rdzv_backend,
        rdzv_endpoint="localhost:0" if standalone else get_rdzv_endpoint(ns),
        rdzv_id=ns.rdzv_id,
        rdzv_conf=ns.rdzv_conf,
        max_restarts=max_restarts,
        monitor_interval=ns.monitor_interval,
        extra=tuple(extra),
        ignored=ignored,
    )


def resolve_plain(
    tokens: list[str], words: list[str], full_command: bool, max_restarts: int | None, launcher: str
) -> Launch:
    """The options a launcher that is not torch's takes (one node: ``--nproc-per-node N``,
    ``--nnodes 1``, ``--standalone``, ``--monitor-interval``, ``-m``, ``--no-python``; ``tf``
    also spans nodes: ``--nnodes N``, ``--node-rank``, ``--rdzv-endpoint``, ``--rdzv-id``,
    ``--rdzv-conf``, ``--rdzv-backend c10d``, ``--local-addr``), read without torch; any other
    torchrun option is an error that names it."""
    if not words:
        raise ConfigError("no worker command: use `trainguard run [options] -- python train.py ...`")
    parser = argparse.ArgumentParser(
        prog=f"trainguard run --launcher {launcher}", add_help=False, exit_on_error=False
    )
    parser.add_argument("--nproc-per-node", "--nproc_per_node", default="1")
    parser.add_argument("--nnodes", default="1:1")
    parser.add_argument("--standalone", action="store_true")
    parser.add_argument("--monitor-interval", "--monitor_interval", type=float, default=0.1)
    parser.add_argument("-m", "--module", action="store_true")
    parser.add_argument("--no-python", "--no_python", action="store_true")
    if launcher == "tf":  # a TensorFlow cluster across nodes (supervisor.tf_cluster)
        for names, _metavar in TORCHRUN_OPTIONS:
            if names[0] in _TF_NODE_OPTIONS:
                parser.add_argument(*names, dest=names[-1].lstrip("-").replace("-", "_"), default=None)
    for names, _metavar in TORCHRUN_OPTIONS:  # accepted, and said not to apply (as under torch)
        if names[-1].lstrip("-").replace("-", "_") in LOG_OPTIONS:
            parser.add_argument(*names, dest=names[-1].lstrip("-").replace("-", "_"), default=None)
    try:
        ns, rest = parser.parse_known_args(tokens)
    except argparse.ArgumentError as exc:
        raise ConfigError(f"--launcher {launcher}: {exc}") from None
    if rest:
        given = ", ".join(t for t in rest if t.startswith("-"))
        raise ConfigError(
            f"{given}: torchrun's option(s) that only --launcher torch takes (--launcher {launcher})"
        )
    if not ns.nproc_per_node.isdigit() or int(ns.nproc_per_node) < 1:
        raise ConfigError(
            f"--nproc-per-node {ns.nproc_per_node}: --launcher {launcher} takes a number of processes"
        )
    nodes = _tf_nodes(ns) if launcher == "tf" else None
    if nodes is None and ns.nnodes not in ("1", "1:1"):
        raise ConfigError(f"--nnodes {ns.nnodes}: --launcher {launcher} runs one node")
    if ns.module and ns.no_python:
        raise ConfigError("give either -m (a module) or --no-python (a command), as torchrun")
    if ns.no_python or full_command:
        cmd = list(words)
    else:
        python = os.getenv("PYTHON_EXEC", sys.executable)
        cmd = [python, "-u", *(["-m"] if ns.module else []), *words]
    restarts = 3 if max_restarts is None else max_restarts
    if restarts < 0:
        raise ConfigError(f"--max-restarts {restarts}: need restarts >= 0")
    return Launch(
        cmd=tuple(cmd),
        nproc_per_node=int(ns.nproc_per_node),
        nnodes=ns.nnodes,
        standalone=ns.standalone,
        rdzv_backend="c10d",
        rdzv_endpoint=nodes.rdzv_endpoint if nodes else "",
        rdzv_id=nodes.rdzv_id if nodes else "",
        rdzv_conf=nodes.rdzv_conf if nodes else "",
        max_restarts=restarts,
        monitor_interval=ns.monitor_interval,
        extra=nodes.extra if nodes else (),
        ignored=tuple(f"--{k.replace('_', '-')}" for k in LOG_OPTIONS if getattr(ns, k) is not None),
    )


_TF_NODE_OPTIONS = (
    "--node-rank",
    "--rdzv-endpoint",
    "--rdzv-id",
    "--rdzv-conf",
    "--rdzv-backend",
    "--local-addr",
)


@dataclass(frozen=True, slots=True)
class _Nodes:
    rdzv_endpoint: str
    rdzv_id: str
    rdzv_conf: str
    extra: tuple[str, ...]  # --node-rank, --local-addr as given


def _tf_nodes(ns: argparse.Namespace) -> _Nodes | None:
    """``--framework tf``'s options for a cluster across nodes; None: one node (and none given)."""
    given = [f for f in _TF_NODE_OPTIONS if getattr(ns, f[2:].replace("-", "_")) is not None]
    if ns.nnodes in ("1", "1:1"):
        if given:
            raise ConfigError(f"{', '.join(given)}: --framework tf takes these with --nnodes N (N > 1)")
        return None
    low, _, high = ns.nnodes.partition(":")
    if not low.isdigit() or (high and high != low) or int(low) < 2:
        raise ConfigError(
            f"--nnodes {ns.nnodes}: --framework tf takes a fixed number of nodes (--nnodes N): "
            "a TensorFlow cluster restarts whole, it does not grow or shrink by nodes"
        )
    if ns.standalone or not ns.rdzv_endpoint:
        raise ConfigError(
            f"--nnodes {ns.nnodes}: give every node --rdzv-endpoint HOST:PORT (node 0's address; "
            "not --standalone) and the same --rdzv-id"
        )
    if ns.rdzv_backend not in (None, "c10d"):
        raise ConfigError(f"--rdzv-backend {ns.rdzv_backend}: --framework tf uses torch's c10d rendezvous")
    if ns.node_rank is not None and (not ns.node_rank.isdigit() or int(ns.node_rank) >= int(low)):
        raise ConfigError(
            f"--node-rank {ns.node_rank}: give 0 to {int(low) - 1} (node 0 hosts the rendezvous)"
        )
    extra: tuple[str, ...] = ()
    for flag, value in (("--node-rank", ns.node_rank), ("--local-addr", ns.local_addr)):
        extra += (flag, value) if value is not None else ()
    return _Nodes(ns.rdzv_endpoint, ns.rdzv_id or "", ns.rdzv_conf or "", extra)
