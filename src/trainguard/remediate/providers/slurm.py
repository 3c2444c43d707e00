"""Slurm through ``scontrol``: drain with a reason, resume, reboot ASAP.

    scontrol update nodename=N state=drain reason="trainguard: xid GPU 3 inc 12"
    scontrol update nodename=N state=resume
    scontrol reboot ASAP nextstate=resume reason="trainguard: ..." N

Each call reads the node's state first (``scontrol show node -o N``), so a second drain of a
drained node, or a resume of an idle one, is ``already`` rather than an error. ``SLURM_CONF``
(``slurm_conf=``) points at the cluster. A timeout is ambiguous: the caller verifies.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from trainguard.errors import ConfigError
from trainguard.remediate.providers import Outcome, Status, Target

__all__ = ["MAX_REASON", "SlurmProvider", "node_state"]

MAX_REASON = 99  # Slurm keeps longer reasons, but sinfo -R and people read the first ~100


class SlurmProvider:
    name = "slurm"

    def __init__(
        self, scontrol: str = "scontrol", slurm_conf: str | None = None, timeout_s: float = 20.0
    ) -> None:
        path = shutil.which(scontrol)
        if path is None:
            raise ConfigError(f"{scontrol} not found: install slurm-client (apt-get install slurm-client)")
        self.scontrol, self.timeout_s = path, timeout_s
        self.env = dict(os.environ)
        if slurm_conf is not None:
            self.env["SLURM_CONF"] = slurm_conf

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.scontrol, *args],
            capture_output=True,
            text=True,
            timeout=self.timeout_s,
            env=self.env,
            check=False,
        )

    def show(self, node: str) -> dict[str, str] | None:
        """The node's fields (``State``, ``Reason``...); None when Slurm cannot be asked."""
        return self._show(node)[0]

    def _show(self, node: str) -> tuple[dict[str, str] | None, str]:
        try:
            r = self._run("show", "node", "-o", node)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, str(exc)
        if r.returncode != 0:
            return None, (r.stderr or r.stdout).strip()
        return node_state(r.stdout), ""

    def apply(self, remedy: str, target: Target) -> Outcome:
        node, reason = target.node, clip_reason(target.reason)
        info, err = self._show(node)
        if info is None:  # a node Slurm does not know is definite; a controller not answering may pass
            unknown = "not found" in err or "Invalid node name" in err
            return Outcome(Status.FAILED, f"scontrol show node {node}: {err}", retry=not unknown)
        flags = set(info.get("State", "").upper().split("+"))
        if remedy == "drain":
            if "DRAIN" in flags:
                return Outcome(Status.ALREADY, f"already drained: {info.get('Reason', '')}")
            args = ["update", f"nodename={node}", "state=drain", f"reason={reason}"]
        elif remedy == "resume":
            if not flags & {"DRAIN", "DOWN", "FAIL"}:
                return Outcome(Status.ALREADY, f"not drained ({info.get('State')})")
            args = ["update", f"nodename={node}", "state=resume"]
        elif remedy == "reboot_node":
            if flags & {"REBOOT_REQUESTED", "REBOOT_ISSUED"}:
                return Outcome(Status.ALREADY, "reboot already requested")
            args = ["reboot", "ASAP", "nextstate=resume", f"reason={reason}", node]
        elif remedy == "hardware_inspection":  # drained with a reason nothing resumes automatically
            if "DRAIN" in flags and "inspection" in info.get("Reason", ""):
                return Outcome(Status.ALREADY, "already drained for inspection")
            args = [
                "update",
                f"nodename={node}",
                "state=drain",
                f"reason={clip_reason(reason + ' inspection')}",
            ]
        else:
            return Outcome(Status.FAILED, f"slurm cannot {remedy}")
        try:
            r = self._run(*args)
        except subprocess.TimeoutExpired:
            return Outcome(Status.AMBIGUOUS, f"scontrol {args[0]} timed out after {self.timeout_s:g}s")
        except OSError as exc:
            return Outcome(Status.FAILED, f"cannot run scontrol: {exc}")
        if r.returncode == 0:
            return Outcome(Status.DONE, " ".join(args[:3]))
        err = (r.stderr or r.stdout).strip()
        # "Invalid node name" / "Invalid node state" are definite; a controller not answering may pass.
        retry = "Unable to contact" in err or "timed out" in err or "Socket" in err
        return Outcome(Status.FAILED, f"scontrol {args[0]}: {err}", retry=retry)

    def verify(self, remedy: str, target: Target) -> bool | None:
        info = self.show(target.node)
        if info is None:
            return None
        flags = set(info.get("State", "").upper().split("+"))
        if remedy in ("drain", "hardware_inspection"):
            return "DRAIN" in flags
        if remedy == "resume":
            return not flags & {"DRAIN", "DOWN"}
        if remedy == "reboot_node":
            return bool(flags & {"REBOOT_REQUESTED", "REBOOT_ISSUED"})
        return None


def clip_reason(reason: str) -> str:
    """One line, no quotes that would end the argument, at most MAX_REASON characters."""
    text = " ".join(reason.replace('"', "'").split())
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


def node_state(text: str) -> dict[str, str]:
    """``scontrol show node -o`` output as a dict; ``Reason`` runs to the end of the line."""
    out: dict[str, str] = {}
    line = text.strip().splitlines()[0] if text.strip() else ""
    head, sep, reason = line.partition(" Reason=")
    for part in head.split():
        k, eq, v = part.partition("=")
        if eq:
            out[k] = v
    if sep:
        out["Reason"] = reason.rsplit(" [", 1)[0].strip()  # drop the "[root@time]" suffix
    return out
