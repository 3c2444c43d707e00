"""Evidence of the kernel's OOM killer: the memory cgroup's ``oom_kill`` counter.

A worker killed by SIGKILL was killed by the OOM killer only if the kernel says so: the counter
of the cgroup the workers run in (cgroup v2 ``memory.events``, v1 ``memory.oom_control``) went
up. Without that (or an OOM-killer line in the logs) a SIGKILL could as well be an operator, the
scheduler or a chaos drill, and the incident must say it does not know.
"""

from __future__ import annotations

from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def oom_kills(pid: int | str = "self", root: Path = CGROUP_ROOT) -> int | None:
    """The OOM-kill count of ``pid``'s memory cgroup; None when it cannot be read."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controllers == "":  # cgroup v2
            candidates = [root / rel / "memory.events", root / "memory.events"]
        elif "memory" in controllers.split(","):  # cgroup v1
            candidates = [
                root / "memory" / rel / "memory.oom_control",
                root / "memory" / "memory.oom_control",
            ]
        else:
            continue
        for file in candidates:
            count = _read_oom_kill(file)
            if count is not None:
                return count
    return None


def _read_oom_kill(file: Path) -> int | None:
    try:
        text = file.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None
