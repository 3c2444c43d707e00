"""Generated logs for ``bench_logscan.py``: a GPU node's syslog and a rank's NCCL_DEBUG=INFO output.

Both are built by repeating four pre-built blocks of 40,000 lines, and both know how many
findings they planted: a finding is one failure event (torch prints a watchdog timeout as six
lines, a CUDA error with three lines of hints: each counts once), and two planted findings are
always more than 60 lines apart, so they never fold into one.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

# The grep baseline: the patterns a user would write for these failures, one ERE per line.
USER_PATTERNS = ("Xid", "SXid", "NCCL WARN", "CUDA error", "out of memory", "watchdog", "timed out",
                 "illegal memory", "ECC", "segfault", "Killed process", "Traceback")  # fmt: skip
BLOCK_LINES = 40_000
MIN_GAP = 60

NOISE = [
    "systemd[1]: Started Session {n} of user slurm.",
    "systemd[1]: session-{n}.scope: Deactivated successfully.",
    "sshd[{pid}]: Accepted publickey for ops from 10.2.{a}.{b} port {port} ssh2: ED25519 SHA256:q8R1xq0lV2",
    "sshd[{pid}]: pam_unix(sshd:session): session opened for user ops(uid=1000) by (uid=0)",
    'kubelet[1873]: I1122 08:{mm}:{ss}.{us} 1873 kubelet_pods.go:1090] "Clean up pod" pod="train/worker-{n}"',
    'containerd[1402]: time="2026-11-22T08:{mm}:{ss}.{us}Z" level=info msg="shim disconnected" id={hex}',
    'containerd[1402]: time="2026-11-22T08:{mm}:{ss}.{us}Z" level=error msg="failed to delete" id={hex}',
    "slurmd[2010]: launch task StepId={n}.0 request from UID:1000 GID:1000 HOST:10.2.{a}.{b} PORT:{port}",
    "slurmstepd[{pid}]: done with job {n}",
    "chronyd[990]: Selected source 10.2.0.{a} (ntp{b}.cluster.local)",
    "CRON[{pid}]: (root) CMD (/usr/local/bin/node-exporter-textfile.sh)",
    "rsyslogd[880]: imjournal: {n} messages lost due to rate-limiting (20000 allowed within 600 seconds)",
    "kernel: [{up}] mlx5_core 0000:{bus}:00.0: mlx5_fw_tracer_handle_traces:742:(pid {pid}): FWTracer: Events were lost",
    "kernel: [{up}] IPv4: martian source 10.2.{a}.{b} from 10.2.{b}.{a}, on dev ib0",
    "kernel: [{up}] pcieport 0000:{bus}:01.0: AER: Corrected error received: 0000:{bus}:00.0",
    "kernel: [{up}] EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode. Quota mode: none.",
    "nvidia-persistenced[1201]: device 0000:{bus}:00.0 - persistence mode enabled.",
    "nv-hostengine[1311]: DCGM field watch updated for group {n}",
    "python[{pid}]: step {n} | loss 2.{us} | lr 3.0e-4 | grad_norm 0.{b} | 412 TFLOP/s",
    "kernel: [{up}] nvme nvme0: I/O {n} QID 7 timeout, completion polled",
    "systemd-logind[1100]: New session {n} of user ops.",
    "NetworkManager[1050]: <info>  [1763800807.{us}] device (ib0): carrier: link connected",
    'node_exporter[1600]: ts=2026-11-22T08:{mm}:{ss}.{us}Z caller=collector.go:169 level=warn msg="collector failed"',
]
# lines that carry an anchor literal but are not findings (the scanner must still look at them)
NEAR = [
    'dockerd[1500]: time="2026-11-22T08:{mm}:{ss}Z" level=warning msg="Error getting v2 registry: timeout"',
    "kernel: [{up}] ACPI Error: AE_NOT_FOUND, While resolving a named reference package element (20210730/dspkginit-438)",
]
NVIDIA_INFO = [
    "python[{pid}]: node{a}:{pid}:{pid} [{b}] NCCL INFO Channel 0{b}/32 :    0   1   2   3   4   5   6   7",
    "python[{pid}]: node{a}:{pid}:{pid} [{b}] NCCL INFO comm 0x55d3c8a0 rank {b} nranks 512 - Init COMPLETE",
    "kernel: [{up}] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07  Fri May 31 09:35:42 UTC 2024",
]
FINDINGS = [
    "kernel: [{up}] NVRM: Xid (PCI:0000:{bus}:00): 79, pid={pid}, name=python, GPU has fallen off the bus.",
    "kernel: [{up}] NVRM: Xid (PCI:0000:{bus}:00): 13, pid={pid}, name=python, Graphics SM Warp Exception on (GPC 1, TPC 0, SM 0): Out Of Range Address",
    "kernel: [{up}] NVRM: Xid (PCI:0000:{bus}:00): 48, pid={pid}, name=python, An uncorrectable double bit error (DBE) has been detected.",
    "kernel: [{up}] nvidia-nvswitch2: SXid (PCI:0000:{bus}:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)",
    "python[{pid}]: node{a}:{pid}:{pid} [{b}] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.2.{a}.{b}<{port}> with error 12, opcode 0, len 0, vendor err 129",
    "python[{pid}]: [rank{b}]:[E1122 08:{mm}:{ss}.{us} ProcessGroupNCCL.cpp:616] [Rank {b}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={n}, OpType=ALLREDUCE, NumelIn=262144, NumelOut=262144, Timeout(ms)=600000) ran for 600042 milliseconds before timing out.",
    "python[{pid}]: RuntimeError: CUDA error: an illegal memory access was encountered",
    "python[{pid}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {b} has a total capacity of 79.10 GiB",
    "kernel: [{up}] Out of memory: Killed process {pid} (python) total-vm:81234567kB, anon-rss:51234567kB, file-rss:0kB",
]  # fmt: skip


# --- the training log: one node's 8 ranks, torchrun output with NCCL_DEBUG=INFO ---------------
_NCCL = "node{node:02d}:{pid}:{tid} [{lr}] NCCL INFO "
NCCL_INFO = [
    _NCCL + "Channel {ch:02d}/0 : {r}[{lr}] -> {r2}[{lr2}] via P2P/CUMEM/read",
    _NCCL + "Channel {ch:02d}/1 : {r}[{lr}] -> {r2}[{lr2}] [send] via NET/IB/{lr}/GDRDMA",
    _NCCL + "Connected all rings",
    _NCCL + "Connected all trees",
    _NCCL + "threadThresholds 8/8/64 | 512/8/64 | 512 | 512",
    _NCCL
    + "24 coll channels, 24 collnet channels, 16 nvls channels, 32 p2p channels, 32 p2p channels per peer",
    _NCCL
    + "comm 0x{hex} rank {r} nranks 64 cudaDev {lr} nvmlDev {lr} busId {bus}000 commId 0x{hex} - Init COMPLETE",
    _NCCL
    + "AllReduce: opCount {op} sendbuff 0x{hex} recvbuff 0x{hex} count 262144 datatype 7 op 0 root 0 comm 0x{hex} [nranks=64] stream 0x{hex}",
    _NCCL
    + "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB [3]mlx5_3:1/IB [RO]; OOB eth0:10.0.0.{a}<0>",
    _NCCL + "NET/Plugin: Failed to find ncclNetPlugin_v8 symbol.",
    _NCCL + "Call to connect returned Connection refused, retrying",
    _NCCL + "[Service thread] Connection closed by localRank {lr2}",
]
STEPS = [
    "[rank{r}]: step {n} | loss 2.{us} | lr 3.0e-4 | grad_norm 0.{b} | 412 TFLOP/s | {ms} ms/step",
    " [2026-11-24 {t}] iteration {n:>8}/  500000 | consumed samples: {cs:>12} | elapsed time per iteration (ms): {ms}.4 | "
    "learning rate: 3.000E-04 | global batch size:  1024 | lm loss: 2.{us}E+00 | loss scale: 1.0 | grad norm: 0.{b} | "
    "number of skipped iterations:   0 | number of nan iterations:   0 |",
]
WARNINGS = [
    "[rank{r}]:/usr/local/lib/python3.11/dist-packages/torch/distributed/distributed_c10d.py:4021: UserWarning: No device "
    "id is provided via `init_process_group` or `barrier `. Using the current device set by the user.",
    "[rank{r}]:[W1124 {t}.{us} {pid} ProcessGroupNCCL.cpp:4561] Warning: TORCH_NCCL_AVOID_RECORD_STREAMS=1 has no effect "
    "for point-to-point collectives. (function operator())",
    "[rank{r}]:/usr/local/lib/python3.11/dist-packages/torch/utils/checkpoint.py:295: FutureWarning: "
    "`torch.cpu.amp.autocast(args...)` is deprecated. Please use `torch.amp.autocast('cpu', args...)` instead.",
    "[rank{r}]:[2026-11-24 {t},{ms}] [WARNING] [stage3.py:2117:step] 1 pytorch allocator cache flushes since last step. "
    "this happens when there is high memory pressure and is detrimental to performance.",
    "[rank{r}]:W1124 {t}.{us} {pid} torch/_dynamo/convert_frame.py:844] [0/8] torch._dynamo hit config.cache_size_limit (8)",
    "[rank{r}]: [2026-11-24 {t}] saving checkpoint at iteration {n} to /checkpoints/gpt-175b",
]
_E = "[rank{r}]:[E1124 {t}.{us} {pid} ProcessGroupNCCL.cpp:{n}] "
_PG = "[PG ID 0 PG GUID 0(default_pg) Rank {r}] "
_WORK = "WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=262144, NumelOut=262144, Timeout(ms)=600000)"
_HINTS = [
    "[rank{r}]: CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
    "[rank{r}]: For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
    "[rank{r}]: Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
]
_TRACE = ["[rank{r}]: Traceback (most recent call last):", '[rank{r}]:   File "/workspace/train.py", line 212, in <module>',
          "[rank{r}]:     loss.backward()"]  # fmt: skip
EVENTS: list[list[str]] = [
    [_E + "[Rank {r}] Watchdog caught collective operation timeout: " + _WORK + " ran for 600042 milliseconds before timing out.",
     _E + _PG + "Exception (either an error or timeout) detected by watchdog at work: {seq}, last enqueued NCCL work: {seq}, "
     "last completed NCCL work: {n}.",
     _E + "Stack trace of the failed collective not found, potentially because FlightRecorder is disabled.",
     _E + "[Rank {r}] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, "
     "subsequent GPU operations might run on corrupted/incomplete data.",
     _E + "[Rank {r}] To avoid data inconsistency, we are taking the entire process down.",
     _E + _PG + "Process group watchdog thread terminated with exception: [Rank {r}] Watchdog caught collective operation "
     "timeout: " + _WORK + " ran for 600042 milliseconds before timing out."],
    [*_TRACE, "[rank{r}]: RuntimeError: CUDA error: an illegal memory access was encountered", *_HINTS],
    [_NCCL.replace("NCCL INFO ", "") + "transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.0.{a}.{b}"
     "<{port}> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.0.0.{a} remoteGids::ffff:10.0.{a}.{b}",
     _NCCL + "transport/net.cc:1298 -> 6", _NCCL + "proxy.cc:694 -> 6"],
    [*_TRACE, "[rank{r}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {lr} has a total "
     "capacity of 79.10 GiB of which 1.21 GiB is free. Including non-PyTorch memory, this process has 77.88 GiB memory in use."],
    [*_TRACE, "[rank{r}]: RuntimeError: CUDA error: uncorrectable ECC error encountered", *_HINTS],
    [_E + _PG + "Heartbeat monitor timed out! Process will be terminated after dumping debug info. workMetaList_.size()=12",
     _E + _PG + "ProcessGroupNCCL preparing to dump debug info.",
     _E.replace("[E", "[F") + _PG + "ProcessGroupNCCL's watchdog got stuck for 600 seconds without making progress in "
     "monitoring enqueued collectives."],
    ["[rank{r}]: torch.distributed.DistBackendError: NCCL communicator was aborted on rank {r}. Original reason for failure "
     "was: NCCL error: remote process exited or there was a network error, NCCL version 2.21.5"],
    [*_TRACE, "[rank{r}]: RuntimeError: DataLoader worker (pid {pid}) is killed by signal: Killed."],
]  # fmt: skip


def _fields(rng: random.Random, i: int) -> dict[str, object]:
    mm, ss = (i // 60) % 60, i % 60
    r, r2 = rng.randrange(8), rng.randrange(8)
    return dict(n=rng.randrange(1, 99999), pid=rng.randrange(300, 65000), tid=rng.randrange(300, 65000),
                a=rng.randrange(256), b=rng.randrange(8), port=rng.randrange(1024, 65535), mm=f"{mm:02d}",
                ss=f"{ss:02d}", us=f"{rng.randrange(10**6):06d}", hex=f"{rng.getrandbits(48):012x}",
                up=f"{1000 + i * 0.01:12.6f}", bus=f"{rng.choice([0x18, 0x3b, 0x5e, 0x86, 0xaf, 0xd8]):02x}",
                node=3, r=r, lr=r, r2=r2, lr2=r2, ch=rng.randrange(32), op=f"{rng.randrange(1 << 20):x}",
                t=f"10:{mm:02d}:{ss:02d}", ms=rng.randrange(100, 999), cs=i * 1024, seq=rng.randrange(1000, 99999))  # fmt: skip


def syslog_block(
    rng: random.Random, nvidia_rate: float = 0.001, near_rate: float = 0.005
) -> tuple[bytes, int]:
    """~0.1% NVIDIA/NCCL/CUDA lines (two thirds of them findings), ~0.5% anchor-bearing noise, the rest noise."""
    lines, planted, last = [], 0, -MIN_GAP
    for i in range(BLOCK_LINES):
        roll = rng.random()
        group = NOISE
        if roll < nvidia_rate:
            group = FINDINGS if rng.random() < 2 / 3 and i - last > MIN_GAP else NVIDIA_INFO
        elif roll < nvidia_rate + near_rate:
            group = NEAR
        if group is FINDINGS:
            planted, last = planted + 1, i
        fields = _fields(rng, i)
        line = rng.choice(group).format(**fields)
        lines.append(f"Nov 22 08:{fields['mm']}:{fields['ss']} gpu-node-{fields['a']:03d} {line}")
    return ("\n".join(lines) + "\n").encode(), planted


def training_block(
    rng: random.Random, events: int = 2, nccl_share: float = 0.42, step_share: float = 0.40
) -> tuple[bytes, int]:
    """NCCL INFO lines (~42%), step lines (~40%), framework warnings, and ``events`` planted failures."""
    at = sorted(rng.sample(range(MIN_GAP, BLOCK_LINES - MIN_GAP, 2 * MIN_GAP), events))
    lines: list[str] = []
    for i in range(BLOCK_LINES):
        fields = _fields(rng, i)
        if at and i == at[0]:
            at.pop(0)
            lines += [t.format(**fields) for t in rng.choice(EVENTS)]
            continue
        roll = rng.random()
        group = NCCL_INFO if roll < nccl_share else STEPS if roll < nccl_share + step_share else WARNINGS
        lines.append(rng.choice(group).format(**fields))
    return ("\n".join(lines) + "\n").encode(), events


def generate(
    path: Path, size: int, block: Callable[[random.Random], tuple[bytes, int]], seed: int = 0
) -> int:
    """Write about ``size`` bytes of repeated blocks to ``path``; returns the findings planted."""
    rng = random.Random(seed)
    blocks = [block(rng) for _ in range(4)]
    written = planted = n = 0
    with path.open("wb") as fh:
        while written < size:
            data, count = blocks[n % len(blocks)]
            fh.write(data)
            written, planted, n = written + len(data), planted + count, n + 1
    return planted


# -- the NCCL_DEBUG=INFO job: mostly NCCL INFO, step lines, torch.compile warnings, real failures --

COMPILE_WARNINGS = [
    "[rank{r}]:W1124 {t}.{us} {pid} torch/_dynamo/convert_frame.py:906] [{b}/{ch}] torch._dynamo hit "
    "config.recompile_limit (8)",
    "[rank{r}]:W1124 {t}.{us} {pid} torch/_dynamo/convert_frame.py:906] [{b}/{ch}]    function: 'forward' "
    "(/workspace/model.py:{n})",
    "[rank{r}]:W1124 {t}.{us} {pid} torch/_dynamo/convert_frame.py:906] [{b}/{ch}]    last reason: "
    "0/{b}: tensor 'L['x']' size mismatch at index 1. expected {ch}, actual {n}",
    "[rank{r}]:W1124 {t}.{us} {pid} torch/_inductor/utils.py:1250] [{b}/{ch}] Not enough SMs to use max_autotune_gemm mode",
    "[rank{r}]:/usr/local/lib/python3.11/dist-packages/torch/_inductor/compile_fx.py:236: UserWarning: TensorFloat32 "
    "tensor cores for float32 matrix multiplication available but not enabled. Consider setting "
    "`torch.set_float32_matmul_precision('high')` for better performance.",
    "[rank{r}]:W1124 {t}.{us} {pid} torch/_logging/_internal.py:1089] [{b}/{ch}] Profiler function <class "
    "'torch.autograd.profiler.record_function'> will be ignored",
]


def real_failure_lines(root: Path) -> list[str]:
    """The failure lines of the real-line sets (tests/data/real/*.tsv; rows not labelled none)."""
    out = []
    for path in sorted(root.glob("*.tsv")):
        for raw in path.read_text(encoding="utf-8").splitlines():
            if raw and not raw.startswith("#"):
                category, _url, line = raw.split("\t", 2)
                if category != "none" and "{" not in line and "}" not in line:
                    out.append(line)
    return out


def nccl_info_block(
    rng: random.Random, real: list[str], events: int = 2, nccl_share: float = 0.70, step_share: float = 0.20
) -> tuple[bytes, int]:
    """NCCL INFO lines (~70%), step lines (~20%), torch.compile warnings, and ``events`` planted
    failures, half of them a real line from a public bug report."""
    at = sorted(rng.sample(range(MIN_GAP, BLOCK_LINES - MIN_GAP, 2 * MIN_GAP), events))
    lines: list[str] = []
    for i in range(BLOCK_LINES):
        fields = _fields(rng, i)
        if at and i == at[0]:
            at.pop(0)
            event = [rng.choice(real)] if real and rng.random() < 0.5 else rng.choice(EVENTS)
            lines += [t.format(**fields) if t in {x for e in EVENTS for x in e} else t for t in event]
            continue
        roll = rng.random()
        group = (
            NCCL_INFO if roll < nccl_share else STEPS if roll < nccl_share + step_share else COMPILE_WARNINGS
        )
        lines.append(rng.choice(group).format(**fields))
    return ("\n".join(lines) + "\n").encode(), events
