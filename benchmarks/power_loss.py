"""Power-loss crash states of a checkpoint save, the approach of ALICE (Pillai et al., OSDI 2014):
record the file-system calls of real saves, then rebuild the states a crash could leave on disk
and resume from each (used by bench_crash_consistency.py).

Recording: a saver process runs ``Checkpointer(async_save=False).save`` under ``strace -f -y``;
markers (``access("/tg-mark-begin-N")``) cut the trace into one save each, and the saver copies
the checkpoint directory before (the durable starting state) and after each save (where every
byte a save wrote ends up). Replaying: the calls of a save are ops on a small in-memory model of
the directory. A crash after op k leaves every op up to k that a later barrier (up to k) made
durable, and any subset of the others, as POSIX allows:

* data (a write or truncation of a file) is durable once that file is fsync'd;
* a name (create, mkdir, rename, unlink, rmdir) is durable once its directory is fsync'd.

For each k: all ops applied (a process crash), only the durable ones (the most a power loss can
lose), and random subsets between. Each distinct state is written out and a fresh Checkpointer
resumes from it: the resume is good when it does not raise, loads a checkpoint whose every tensor
is that step's, and loses no save that had returned before the crash.
"""

from __future__ import annotations

import hashlib
import random
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SYSCALLS = "openat,write,pwrite64,fsync,fdatasync,rename,renameat,renameat2,mkdir,mkdirat,unlink,unlinkat,rmdir,ftruncate,close,access"
_LINE = re.compile(r"^\d+\s+(\w+)\((.*)\)\s+= (-?\d+)")
_FD = re.compile(r"^(\d+)<([^>]*)>")


@dataclass(frozen=True, slots=True)
class Op:
    kind: str  # create | trunc | write | fsync | mkdir | rename | unlink | rmdir
    path: str = ""  # relative to the checkpoint directory ("" is the directory itself)
    dst: str = ""
    inode: int = -1  # create / trunc / write / fsync of a file
    offset: int = 0
    size: int = 0

    @property
    def parent(self) -> str:
        return self.path.rpartition("/")[0]


def record(saver_cmd: list[str], out: Path) -> Path:
    """Run the saver under strace; the trace file."""
    trace = out / "trace.txt"
    subprocess.run(
        ["strace", "-f", "-y", "-qq", "-s", "0", "-o", str(trace), "-e", f"trace={SYSCALLS}", *saver_cmd],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return trace


def parse(lines: list[str], root: str) -> list[Op]:
    """The ops one save made under ``root`` (absolute path of the checkpoint directory)."""
    ops: list[Op] = []
    fds: dict[int, list[int]] = {}  # fd -> [inode, position]
    inodes: dict[str, int] = {}  # current path -> inode of files created in this save
    rel = lambda p: p[len(root) :].lstrip("/") if p == root or p.startswith(root + "/") else None  # noqa: E731
    for line in lines:
        m = _LINE.match(line)
        if not m:
            continue
        call, args, ret = m.group(1), m.group(2), int(m.group(3))
        if ret < 0:
            continue
        strings = re.findall(r'"([^"]*)"', args)
        fd = _FD.match(args)
        if call == "openat" and strings:
            path = rel(strings[0])
            if path is None:
                continue
            if "O_CREAT" in args or "O_TRUNC" in args:
                if path not in inodes:
                    inodes[path] = 1000 + len(inodes)
                    ops.append(Op("create", path, inode=inodes[path]))
                ops.append(Op("trunc", path, inode=inodes[path]))
                fds[ret] = [inodes[path], 0]
            else:  # a directory opened to fsync it, or a file read
                fds[ret] = [-1, 0]
        elif call in ("write", "pwrite64") and fd and int(fd.group(1)) in fds:
            entry = fds[int(fd.group(1))]
            if entry[0] >= 0:
                ops.append(Op("write", inode=entry[0], offset=entry[1], size=ret))
                entry[1] += ret
        elif call in ("fsync", "fdatasync") and fd:
            path = rel(fd.group(2))
            if path is not None:
                entry = fds.get(int(fd.group(1)), [-1, 0])
                ops.append(Op("fsync", path, inode=entry[0]))
        elif call == "close" and fd:
            fds.pop(int(fd.group(1)), None)
        elif call in ("rename", "renameat", "renameat2") and len(strings) >= 2:
            src, dst = rel(strings[0]), rel(strings[1])
            if src is not None and dst is not None:
                ops.append(Op("rename", src, dst))
                for p in [p for p in inodes if p == src or p.startswith(src + "/")]:
                    inodes[dst + p[len(src) :]] = inodes.pop(p)
        elif call in ("mkdir", "mkdirat") and strings:
            path = rel(strings[0])
            if path is not None:
                ops.append(Op("mkdir", path))
        elif call == "unlinkat" and fd and strings:
            path = rel(f"{fd.group(2)}/{strings[0]}")
            if path is not None:
                ops.append(Op("rmdir" if "AT_REMOVEDIR" in args else "unlink", path))
        elif call in ("unlink", "rmdir") and strings:
            path = rel(strings[0])
            if path is not None:
                ops.append(Op(call, path))
    return ops


def split_saves(trace: Path) -> dict[int, list[str]]:
    """Trace lines between each save's begin and end markers."""
    out: dict[int, list[str]] = {}
    current: int | None = None
    for line in trace.read_text(errors="replace").splitlines():
        if "/tg-mark-begin-" in line:
            current = int(line.split("/tg-mark-begin-")[1].split('"')[0])
            out[current] = []
        elif "/tg-mark-end-" in line:
            current = None
        elif current is not None:
            out[current].append(line)
    return out


def durable(ops: list[Op], k: int) -> list[bool]:
    """For each of the first ``k`` ops: made durable by a barrier among the first ``k``?"""
    out = []
    for i, op in enumerate(ops[:k]):
        later = ops[i + 1 : k]
        if op.kind in ("write", "trunc"):
            out.append(any(b.kind == "fsync" and b.inode == op.inode for b in later))
        elif op.kind == "fsync":
            out.append(True)
        else:  # a name: its directory (or, for a rename, both directories) fsync'd later
            dirs = {op.parent} | ({op.dst.rpartition("/")[0]} if op.kind == "rename" else set())
            out.append(
                all(any(b.kind == "fsync" and b.inode < 0 and b.path == d for b in later) for d in dirs)
            )
    return out


class Tree:
    """The directory as names -> inodes and inode -> bytes."""

    def __init__(self, before: Path, after: Path, ops: list[Op]) -> None:
        self.files: dict[str, int] = {}
        self.dirs: set[str] = {""}
        self.data: dict[int, bytearray] = {}
        for n, path in enumerate(sorted(before.rglob("*"))):
            name = str(path.relative_to(before))
            if path.is_dir():
                self.dirs.add(name)
            else:
                self.files[name] = -(n + 10)
                self.data[-(n + 10)] = bytearray(path.read_bytes())
        self.final = final_contents(after, ops)

    def apply(self, op: Op) -> None:
        if op.kind == "create" and op.parent in self.dirs:
            self.files[op.path] = op.inode
            self.data.setdefault(op.inode, bytearray())
        elif op.kind == "trunc":
            self.data[op.inode] = bytearray()
        elif op.kind == "write":
            buf = self.data.setdefault(op.inode, bytearray())
            content = self.final.get(op.inode, b"")[op.offset : op.offset + op.size]
            if len(buf) < op.offset:
                buf.extend(bytes(op.offset - len(buf)))
            buf[op.offset : op.offset + len(content)] = content
        elif op.kind == "mkdir" and op.parent in self.dirs:
            self.dirs.add(op.path)
        elif op.kind == "rename":
            self._rename(op.path, op.dst)
        elif op.kind == "unlink":
            self.files.pop(op.path, None)
        elif op.kind == "rmdir" and not any(f.startswith(op.path + "/") for f in self.files):
            self.dirs.discard(op.path)

    def _rename(self, src: str, dst: str) -> None:
        if src in self.files:
            self.files[dst] = self.files.pop(src)
        elif src in self.dirs:
            for d in [d for d in self.dirs if d == dst or d.startswith(dst + "/")]:
                self.dirs.discard(d)
            for f in [f for f in self.files if f.startswith(dst + "/")]:
                del self.files[f]
            for d in [d for d in self.dirs if d == src or d.startswith(src + "/")]:
                self.dirs.discard(d)
                self.dirs.add(dst + d[len(src) :])
            for f in [f for f in self.files if f.startswith(src + "/")]:
                self.files[dst + f[len(src) :]] = self.files.pop(f)

    def digest(self) -> str:
        h = hashlib.sha1()
        for name in sorted(self.dirs):
            h.update(b"d" + name.encode())
        for name in sorted(self.files):
            h.update(b"f" + name.encode() + hashlib.sha1(self.data.get(self.files[name], b"")).digest())
        return h.hexdigest()

    def write(self, out: Path) -> None:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        for d in sorted(self.dirs):
            (out / d).mkdir(parents=True, exist_ok=True)
        for name, inode in self.files.items():
            if name.rpartition("/")[0] in self.dirs:
                (out / name).write_bytes(bytes(self.data.get(inode, b"")))


def final_contents(after: Path, ops: list[Op]) -> dict[int, bytes]:
    """Each created inode's bytes, read where it ended up after the save."""
    where: dict[int, str] = {}
    for op in ops:
        if op.kind == "create":
            where[op.inode] = op.path
        elif op.kind == "rename":
            for inode, path in where.items():
                if path == op.path or path.startswith(op.path + "/"):
                    where[inode] = op.dst + path[len(op.path) :]
    out = {}
    for inode, path in where.items():
        try:
            out[inode] = (after / path).read_bytes()
        except OSError:
            out[inode] = b""
    return out


def crash_states(
    before: Path, after: Path, ops: list[Op], rng: random.Random, subsets: int
) -> list[tuple[int, Tree]]:
    """(crash point, state) for every point and every kind of loss, deduplicated."""
    seen: set[str] = set()
    out = []
    for k in range(len(ops) + 1):
        keep = durable(ops, k)
        choices = [[True] * k, keep] + [[d or rng.random() < 0.5 for d in keep] for _ in range(subsets)]
        for chosen in choices:
            tree = Tree(before, after, ops)
            for op, applied in zip(ops[:k], chosen, strict=True):
                if applied:
                    tree.apply(op)
            digest = tree.digest()
            if digest not in seen:
                seen.add(digest)
                out.append((k, tree))
    return out


def check(
    root: Path,
    saves: int,
    rng: random.Random,
    subsets: int,
    resume_ok: Callable[[Path, int], str | None],
) -> tuple[int, int, list[str]]:
    """(states tried, bad resumes, problems). ``resume_ok(dir, min_step)`` resumes from ``dir``
    and returns a problem in words, or None."""
    trace = record(
        [sys.executable, str(Path(__file__).with_name("traced_saver.py")), str(root), str(saves)], root
    )
    ck = str((root / "ck").resolve())
    tried = bad = 0
    problems: list[str] = []
    for step, lines in sorted(split_saves(trace).items()):
        ops = parse(lines, ck)
        states = crash_states(root / f"before-{step}", root / f"after-{step}", ops, rng, subsets)
        for k, tree in states:
            tried += 1
            target = root / "state"
            tree.write(target)
            # Until save(step) returned (k < len(ops)), only the previous step was promised.
            problem = resume_ok(target, step if k == len(ops) else step - 1)
            if problem is not None:
                bad += 1
                problems.append(f"save {step}, crash after op {k}/{len(ops)}: {problem}")
    return tried, bad, problems
