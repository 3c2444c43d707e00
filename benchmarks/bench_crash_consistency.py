"""Crash consistency of checkpoints: SIGKILL savers at random moments, then resume; flip bytes.

    python benchmarks/bench_crash_consistency.py                  # 200 kills, 200 flips
    python benchmarks/bench_crash_consistency.py --kills 20 --flips 50 --async-kills 2
    python benchmarks/bench_crash_consistency.py --json

Kills: a process forked from this one (torch already imported, so a kill cycle takes ~0.1 s)
saves a ~12 MB training state over and over, every tensor filled with the step number, and
reports each step whose save() returned; it is SIGKILLed at a random moment (nearly always
inside a save: payload write, fsync, manifest, rename, pointer move or retention). Then a fresh
Checkpointer resumes: a resume is *valid* when it loads the newest complete checkpoint (the last
reported step, or the one after it if the kill landed after the rename but before the report) and
every loaded tensor holds that step. ``--async-kills`` also kills the background writer process of
an asynchronous Checkpointer mid-write (each costs a writer restart, ~1-2 s); the trainer must get
a CheckpointError and the resume must again be valid.

Flips: one random bit of a random byte of a random file (payload or manifest) of a committed
checkpoint is flipped; ``verify`` must reject it (then the byte is restored and it must pass).
Truncations of a random length are checked the same way.

Keys: kills, valid_resumes, flips, flips_detected, truncations, truncations_detected,
async_kills, async_errors_raised. Target: valid_resumes == kills, flips_detected == flips.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import signal
import struct
import sys
import tempfile
import time
from pathlib import Path

import torch

from trainguard.checkpoint import MANIFEST_NAME, list_checkpoints, newest_valid, verify
from trainguard.errors import CheckpointError
from trainguard.torch import Checkpointer, TrainState


def make_state() -> TrainState:
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.Linear(1024, 512))
    opt = torch.optim.Adam(model.parameters())
    model(torch.zeros(1, 512)).sum().backward()
    opt.step()  # materialise Adam's moments: ~12 MB of state in all
    return TrainState(model, opt, extra={"step": 0})


def fill(state: TrainState, step: int) -> None:
    with torch.no_grad():
        for p in state.model.parameters():
            p.fill_(step)
        for s in state.optimizer.state.values():
            s["exp_avg"].fill_(step)
            s["exp_avg_sq"].fill_(step)
    state.extra["step"] = step


def holds(state: TrainState, step: int) -> bool:
    tensors = list(state.model.parameters())
    tensors += [t for s in state.optimizer.state.values() for t in (s["exp_avg"], s["exp_avg_sq"])]
    return state.extra["step"] == step and all(bool((t == step).all()) for t in tensors)


def _saver(directory: Path, state: TrainState, start: int, report_fd: int) -> None:
    ckpt = Checkpointer(directory, keep_last=2, async_save=False)
    step = start
    while True:
        step += 1
        fill(state, step)
        ckpt.save(step, state)
        os.write(report_fd, struct.pack("!q", step))


def _resume(directory: Path, state: TrainState) -> int:
    with Checkpointer(directory, async_save=False) as ckpt:
        return ckpt.resume(state)


def run_kills(
    directory: Path, kills: int, rng: random.Random, max_delay_s: float
) -> tuple[int, int, list[str]]:
    """(valid resumes, kills that left a torn temporary directory, problems)."""
    state, probe = make_state(), make_state()
    valid, torn, problems, start = 0, 0, [], 0
    for i in range(kills):
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the saver
            os.close(read_fd)
            try:
                _saver(directory, state, start, write_fd)
            finally:
                os._exit(1)
        os.close(write_fd)
        time.sleep(rng.uniform(0.0, max_delay_s))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        torn += any(p.name.startswith(".tmp-") for p in directory.iterdir())
        reported = start
        with os.fdopen(read_fd, "rb") as pipe:
            data = pipe.read()
        for (step,) in struct.iter_unpack("!q", data[: len(data) // 8 * 8]):
            reported = step
        fill(probe, -1)
        resumed = _resume(directory, probe)
        if resumed in (reported, reported + 1) and (resumed == 0 or holds(probe, resumed)):
            valid += 1
        else:
            problems.append(f"kill {i}: resumed {resumed}, last reported save {reported}")
        start = resumed
    return valid, torn, problems


def run_async_kills(directory: Path, kills: int, rng: random.Random) -> tuple[int, int, list[str]]:
    state, probe = make_state(), make_state()
    valid = raised = 0
    problems: list[str] = []
    ckpt = Checkpointer(directory, keep_last=2)
    step = _resume(directory, probe)
    for i in range(kills):
        step += 1
        fill(state, step)
        ckpt.save(step, state)  # warm: the writer is up and idle after this one
        ckpt.wait()
        durable = step
        step += 1
        fill(state, step)
        ckpt.save(step, state)
        time.sleep(rng.uniform(0.0, 0.05))
        writer = ckpt._writer._proc  # the background writer process
        if writer is not None:
            writer.kill()
        try:
            ckpt.wait()
            durable = step  # it finished before the kill landed
        except CheckpointError:
            raised += 1
        fill(probe, -1)
        resumed = _resume(directory, probe)
        if resumed in (durable, step) and holds(probe, resumed):
            valid += 1
        else:
            problems.append(f"async kill {i}: resumed {resumed}, durable {durable}")
        step = resumed
    ckpt.close()
    return valid, raised, problems


def run_flips(directory: Path, flips: int, rng: random.Random) -> tuple[int, int, int]:
    """(flips detected, truncations tried, truncations detected) over committed checkpoints."""
    committed = [c for c in list_checkpoints(directory) if verify(c.path).ok]
    if not committed:
        return 0, 0, 0
    detected = truncated_detected = 0
    for _ in range(flips):
        info = rng.choice(committed)
        path = info.path / rng.choice(["state.pt", MANIFEST_NAME])
        original = path.read_bytes()
        data = bytearray(original)
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        path.write_bytes(data)
        detected += not verify(info.path).ok
        path.write_bytes(original)
        assert verify(info.path).ok, f"restoring {path} did not repair it"
    truncations = flips // 4
    for _ in range(truncations):
        info = rng.choice(committed)
        path = info.path / rng.choice(["state.pt", MANIFEST_NAME])
        original = path.read_bytes()
        path.write_bytes(original[: rng.randrange(len(original))])
        truncated_detected += not verify(info.path).ok
        path.write_bytes(original)
    return detected, truncations, truncated_detected


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--flips", type=int, default=200)
    parser.add_argument("--async-kills", type=int, default=10)
    parser.add_argument("--max-delay", type=float, default=0.25, help="kill within this many seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)  # skipped torn checkpoints are expected here
    torch.set_num_threads(1)  # before any fork
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="tg-crash-"))
    try:
        started = time.perf_counter()
        valid, torn, problems = run_kills(root / "sync", args.kills, rng, args.max_delay)
        async_valid, async_raised, async_problems = run_async_kills(root / "async", args.async_kills, rng)
        flips_detected, truncations, truncations_detected = run_flips(root / "sync", args.flips, rng)
        elapsed = time.perf_counter() - started
        newest = newest_valid(root / "sync")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result = {
        "kills": args.kills + args.async_kills,
        "valid_resumes": valid + async_valid,
        "sync_kills": args.kills,
        "kills_mid_write": torn,
        "async_kills": args.async_kills,
        "async_errors_raised": async_raised,
        "flips": args.flips,
        "flips_detected": flips_detected,
        "truncations": truncations,
        "truncations_detected": truncations_detected,
        "elapsed_s": round(elapsed, 2),
        "problems": (problems + async_problems)[:20],
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"kills: {result['kills']} ({args.kills} savers, {args.async_kills} background writers)")
        print(f"kills that tore a save in progress: {torn}/{args.kills}")
        print(f"valid resumes: {result['valid_resumes']}/{result['kills']} (newest checkpoint {newest})")
        print(f"writer deaths reported as errors: {async_raised}/{args.async_kills}")
        print(f"bit flips detected: {flips_detected}/{args.flips}")
        print(f"truncations detected: {truncations_detected}/{truncations}")
        for problem in result["problems"]:
            print("  PROBLEM", problem)
        print(f"({elapsed:.1f} s)")
    ok = result["valid_resumes"] == result["kills"] and flips_detected == args.flips
    return 0 if ok and truncations_detected == truncations else 1


if __name__ == "__main__":
    sys.exit(main())
