"""A real one-node Slurm cluster for tests: munged, slurmctld and slurmd from Debian's slurm-wlm,
on loopback, with every file (config, munge key and socket, state, logs) in a temp dir.

    with SlurmCluster(tmp_path) as cluster:
        subprocess.run(["sinfo"], env=cluster.env)

Each daemon runs in the foreground as our child with a parent-death signal, so none outlives the
test. Needs root (SlurmUser=root; the tests run as root here and in CI). Where a part is missing,
``require_slurm()`` fails under `make test-all` and CI with how to install it, and skips
elsewhere (``real_parts.missing``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from real_parts import missing
from trainguard.procs import parent_death

NODE = "tgnode1"
DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "scontrol", "sinfo")
INSTALL = "apt-get install -y slurm-wlm munge (make test-all does this)"


def require_slurm() -> None:
    absent = [d for d in DAEMONS if shutil.which(d) is None]
    problem = f"missing {', '.join(absent)}: {INSTALL}" if absent else None
    if problem is None and os.geteuid() != 0:
        problem = "the Slurm test cluster runs its daemons as root (SlurmUser=root): run the tests as root"
    if problem is None:
        return
    missing("a Slurm test cluster", problem)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SlurmCluster:
    def __init__(self, root: Path, extra_conf: str = "", cpus: int = 1) -> None:
        self.root = root
        self.extra_conf = extra_conf
        self.cpus = cpus  # the node's CPUs: the tasks a step may run on it without --overcommit
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.node = NODE

    def __enter__(self) -> SlurmCluster:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, name: str, *args: str) -> None:
        log = open(self.root / "log" / f"{name}.out", "wb")  # noqa: SIM115 (lives as long as the daemon)
        self.procs.append(
            subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, env=self.env, preexec_fn=parent_death()
            )
        )
        log.close()

    def _start(self) -> None:
        r = self.root
        for d in ("munge", "state", "spool", "log"):
            (r / d).mkdir(mode=0o700, exist_ok=True)
        key, sock = r / "munge" / "munge.key", r / "munge" / "sock"
        subprocess.run(
            ["mungekey", "--create", f"--keyfile={key}", "--force"], check=True, capture_output=True
        )
        key.chmod(0o600)
        self._spawn(
            "munged", "munged", "-F", "--force", f"--socket={sock}", f"--key-file={key}",
            f"--log-file={r / 'log' / 'munged.log'}", f"--pid-file={r / 'munge' / 'munged.pid'}",
            f"--seed-file={r / 'munge' / 'seed'}",
        )  # fmt: skip
        self.wait(lambda: sock.exists(), 30, "munged did not create its socket")
        host = socket.gethostname().split(".")[0]
        self.conf.write_text(
            f"""ClusterName=tgtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
StateSaveLocation={r / "state"}
SlurmdSpoolDir={r / "spool"}
SlurmctldPidFile={r / "slurmctld.pid"}
SlurmdPidFile={r / "slurmd.pid"}
SlurmctldLogFile={r / "log" / "slurmctld.log"}
SlurmdLogFile={r / "log" / "slurmd.log"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/linear
MpiDefault=none
ReturnToService=2
RebootProgram=/bin/true
{self.extra_conf}
NodeName={NODE} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=100 State=UNKNOWN
PartitionName=debug Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
"""
        )
        self._spawn("slurmctld", "slurmctld", "-D", "-i")
        self._spawn("slurmd", "slurmd", "-D", "-N", NODE)
        self.wait(lambda: self.state() in ("idle", "drained", "draining"), 90, "the node never came up")

    def state(self) -> str:
        r = subprocess.run(
            ["sinfo", "-h", "-N", "-n", NODE, "-o", "%T"],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        return r.stdout.strip().rstrip("*~#!%$@^-")

    def reasons(self) -> str:
        """``sinfo -R`` as a person would read it."""
        r = subprocess.run(
            ["sinfo", "-R", "-h", "-o", "%60E|%N"], env=self.env, capture_output=True, text=True
        )
        return r.stdout

    def wait(self, check: object, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():  # type: ignore[operator]
                return
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[0]} exited ({p.returncode}): {self.logs()}")
            time.sleep(0.2)
        raise RuntimeError(f"{what} within {timeout:g}s: {self.logs()}")

    def logs(self) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*")):
            out.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(out)

    def stop(self) -> None:
        for p in reversed(self.procs):  # slurmd, slurmctld, then munged
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs.clear()
