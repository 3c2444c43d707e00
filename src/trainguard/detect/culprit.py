"""Whom a training-log line blames: the rank and the node it names (pure; no I/O).

Sits beside ``training_log``: the classifier says what went wrong, these say who. A line that
names the failed rank wins over the tag of the process that printed it: mpirun prints "process
rank 3 ... exited on signal 9" for rank 3, and Horovod's coordinator (rank 0) prints the ranks
that never submitted a tensor::

    >>> line = "mpirun noticed that process rank 3 with PID 4242 on node gpu-b07 exited on signal 9 (Killed)."
    >>> line_rank(line), line_node(line)
    (3, 'gpu-b07')
    >>> lost_node("  Remote daemon: [[64112,0],1] on node 10.126.10.10")
    '10.126.10.10'
"""

from __future__ import annotations

import re

__all__ = ["line_node", "line_rank", "lost_node", "named_rank"]

# The failed rank a line names: mpirun/prterun, MPI_Abort (Open MPI, MPICH), Horovod's stall
# inspector when one rank is missing, srun's task (Slurm's task id is the global rank), the
# TF/XLA coordination service's task (TF_CONFIG's task index, JAX's process index): the task that timed
# out, was set to ERROR, is first of those that stopped sending heartbeats, or whose error a survivor's
# collective reports ("Error reported from /job:worker/task:1")
_TASK = r"/job:[\w-]+/(?:replica:\d+/)?task:(\d+)"
_NAMED = re.compile(
    r"noticed that (?:process|job) rank (\d+)|MPI_ABORT was invoked on rank (\d+)"
    r"|called MPI_Abort\([^)]*\) - process (\d+)|\[missing ranks: (\d+)\]|srun: error: [^:\s]+: task (\d+): "
    rf"|/task:(\d+) heartbeat timeout|{_TASK} has been set to ERROR|Error reported from {_TASK}"
    rf"|stopped sending heartbeats\):\s*{_TASK}"
)
_RANK_TAG = re.compile(r"\[rank(\d+)\]:")
# Open MPI's --tag-output ("[1,3]<stderr>:") and horovodrun's ("[3]<stderr>:", behind a timestamp)
_STREAM_TAG = re.compile(r"\[(?:\d+,)?(\d+)\]<std(?:out|err)>:")
_RANK_TEXT = re.compile(r"\[(?:PG (?:ID )?\d+ (?:PG GUID \d+(?:\([^)]*\))? )?)?Rank (\d+)\]")

# A node reported lost: Open MPI/PRRTE's remote daemon, Slurm's node failure, Ray's GCS
_LOST = re.compile(
    r"Remote daemon\s*: \S+ on node (\S+)|Node failure on ([\w.\-]+)|\bON ([\w.\-]+) CANCELLED AT \S+ DUE TO NODE FAILURE"
    r"|(?:ip|address): ([\w.:\-]+)(?: and node name: \S+)? has been marked dead"
)
# The node a rank failed on: mpirun/prterun ("on node X exited"), srun ("error: X: task N:")
_FAILED_ON = re.compile(
    r"noticed that (?:process|job) rank \d+ with PID \d+ on node \"?([^\s\"]+)\"? exited"
    r"|srun: error: ([^:\s]+): tasks? [\d,-]+: "
)


def _first(m: re.Match[str] | None) -> str | None:
    return next((g for g in m.groups() if g), None) if m else None


def named_rank(text: str) -> int | None:
    """The failed rank a line names (not the tag of the process that printed it), else None.

    >>> named_rank("E0000 base_collective_executor.cc:252] BaseCollectiveExecutor::StartAbort UNAVAILABLE: "
    ...            "Error reported from /job:worker/task:1: The following tasks are unhealthy")
    1
    """
    named = _first(_NAMED.search(text))
    return int(named) if named is not None else None


def line_rank(text: str) -> int | None:
    """The rank a line speaks for: the failed rank it names, else its ``[rankN]:`` or stream tag
    (``[1,3]<stderr>:``), else a ``[Rank N]``/``[PG ... Rank N]`` tag."""
    named = named_rank(text)
    if named is not None:
        return named
    m = _RANK_TAG.search(text, 0, 200) or _STREAM_TAG.search(text, 0, 200) or _RANK_TEXT.search(text)
    return int(m.group(1)) if m else None


def lost_node(text: str) -> str | None:
    """The node a line reports lost (its daemon gone, failed, marked dead), else None."""
    return _first(_LOST.search(text))


def line_node(text: str) -> str | None:
    """The node a line names as where a failure happened: a lost node, or the node a rank died on."""
    return lost_node(text) or _first(_FAILED_ON.search(text))
