"""Generate trainguard's own Xid catalog from NVIDIA's reference export.

    python tools/gen_xid_catalog.py [../shared/reference/xid/xid_catalog.csv]

Facts (code, mnemonic, resolution buckets, GPU generations) are copied from the reference; the
class, severity, category, action, health, root cause and the one-line description are
trainguard's own judgement, kept in the tables below. Writes
``src/trainguard/detect/data/xid_catalog.csv``, the one Xid table the detectors (health and
action of one occurrence), the parser and the root-cause rule all read.
"""

from __future__ import annotations

import csv
import io
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_REF = ROOT.parent / "shared" / "reference" / "xid" / "xid_catalog.csv"
OUT = ROOT / "src" / "trainguard" / "detect" / "data" / "xid_catalog.csv"
GENERATIONS = ("A100", "H100", "B100", "GB200")

# Our class per code where the mnemonic alone would mislead (e.g. 109 is raised by the driver
# but caused by the application; 154 only restates what another Xid needs).
CLASS = {
    **dict.fromkeys([8, 11, 13, 25, 31, 32, 43, 68, 69, 80, 109, 141], "application"),
    45: "sympathetic",
    **dict.fromkeys([48, 58, 63, 64, 92, 94, 95, 140, 156, 157, 168, 171, 172], "memory"),
    **dict.fromkeys(
        [74, 108, 121, 136, 137, 144, 145, 146, 147, 148, 149, 150, 155, 159, 166, 167, 170], "interconnect"
    ),
    **dict.fromkeys([46, 54, 79, 143, 158, 162, 163, 164, 165], "hardware"),
    **dict.fromkeys(
        [37, 38, 44, 59, 61, 62, 66, 67, 78, 87, 93, 110, 119, 120, 122, 123, 124, 125, 151, 160, 161, 169],
        "firmware_driver",
    ),
    154: "recovery_action",
}

CATEGORY = {
    "application": "application_bug",
    "sympathetic": "application_bug",
    "memory": "gpu_memory_ecc",
    "interconnect": "interconnect",
    "hardware": "gpu_hardware",
    "firmware_driver": "driver_software",
    "recovery_action": "gpu_hardware",
}
CATEGORY_OVERRIDE = {
    54: "thermal_power",
    162: "thermal_power",
    163: "thermal_power",
    164: "thermal_power",
    165: "thermal_power",
}

# Immediate bucket -> our action. WORKFLOW_* buckets are resolved per code below.
ACTION = {
    "RESTART_APP": "restart_app",
    "RESET_GPU": "reset_gpu",
    "RESTART_BM": "reboot_node",
    "CONTACT_SUPPORT": "contact_support",
    "IGNORE": "ignore",
    "CHECK_MECHANICALS": "contact_support",
    "UPDATE_SWFW": "contact_support",
    "RESTART_VM": "reboot_node",  # the VM is the node
    "CHECK_UVM": "ignore",  # bare-metal training runs no UVM/vGPU guests
    "XID_154": "reset_gpu",  # refined from the line's own text by the parser
    "WORKFLOW_XID_48": "reset_gpu",
    "WORKFLOW_XID_45": "restart_app",  # solo; a sympathetic 45 is downgraded to ignore
    "WORKFLOW_NVLINK_ERR": "run_diagnostics",
    "WORKFLOW_NVLINK5_ERR": "reset_gpu",  # refined by the line's Fatal/Nonfatal word
}
# Codes the reference leaves without a bucket (new in R570+): our own call.
ACTION_NO_BUCKET = {
    162: "ignore",
    163: "ignore",
    164: "contact_support",
    165: "contact_support",
    166: "reset_gpu",
    167: "reboot_node",
    168: "contact_support",
    169: "reset_gpu",
    170: "reset_gpu",
    171: "reset_gpu",
    172: "reset_gpu",
}

# Where a training fleet must act differently from NVIDIA's immediate bucket: (health, action) of
# one occurrence seen alone. Every other code: health from its severity, action from its bucket.
POLICY = {
    46: ("failed", "reset_gpu"),  # GPU timeout
    63: ("ok", "reset_gpu"),  # a row remap / page retirement recorded: reset the GPU to activate it
    64: ("failed", "contact_support"),  # out of spare rows: replace the GPU
    74: ("degraded", "run_diagnostics"),  # NVLink error
    92: ("failed", "contact_support"),  # excessive single-bit errors: the memory is wearing out
    94: ("failed", "reset_gpu"),  # contained ECC error: the job died, and a remap waits for a reset
    109: ("failed", "reset_gpu"),  # context-switch timeout
    110: ("failed", "reset_gpu"),  # security engine fault
    136: ("failed", "reset_gpu"),  # link training failure
    154: ("ok", "none"),  # the driver's recovery action changed: read from the line's own text
    155: ("failed", "reset_gpu"),  # NVLink software-defined error
    156: ("degraded", "reset_gpu"),  # a resource was retired: reset to apply
}
HEALTH_BY_SEVERITY = {"fatal": "failed", "error": "degraded", "warning": "ok", "info": "ok"}
TEXT_DECIDES = frozenset(range(144, 151))  # NVLink5: the line's Fatal/Nonfatal word decides (health "")

# The root cause an Xid points to, in the Llama 3 interruption taxonomy (incidents.RootCause).
# "symptom": cleanup or a restatement after an earlier error, never the cause; no entry: decided
# from the event's category and text.
ROOT_CAUSE = {
    **dict.fromkeys((48, 63, 64, 92, 94, 95, 140, 171), "gpu_hbm_memory"),
    172: "gpu_sram",
    **dict.fromkeys((46, 74, 79, 109, 136, 143, 155, 158, 167), "faulty_gpu"),
    **dict.fromkeys(range(144, 151), "faulty_gpu"),  # NVLink5 errors
    **dict.fromkeys((61, 62, 110, 119, 120, 169), "gpu_system_processor"),
    **dict.fromkeys((13, 31, 32, 43, 69), "software_bug"),  # application-class Xids
    54: "host",  # auxiliary power not connected
    45: "symptom",  # preemptive cleanup after an earlier error
    154: "symptom",  # the driver restating the action an earlier error needs
}

# Severity: fatal = the GPU is unusable until reset/reboot/repair; error = a fault that needs an
# action; warning = worth recording (often benign alone); info = expected noise.
FATAL = {48, 62, 64, 79, 95, 119, 120, 140, 143, 154, 158, 167, 169, 171, 172}
ERROR = {94}
INFO = {14, 37, 43, 106, 107, 141, 152, 153, 160, 162, 163}

DESCRIPTION = {
    8: "GPU engine stopped making progress (idle timeout); usually the application hung the channel",
    11: "Engine received a malformed command stream from the application",
    13: "Graphics/compute engine exception, e.g. an out-of-range access in a kernel; repeats on one GPU point at hardware",
    14: "Test error injected on purpose; nothing to fix",
    25: "Engine received an illegal command stream from the application",
    31: "GPU memory page fault (MMU); usually an application bug, repeats on one GPU point at hardware",
    32: "Push-buffer DMA engine saw a corrupted command stream",
    37: "Firmware was asked for a method it does not implement",
    38: "Context-switch firmware watchdog fired",
    43: "GPU stopped the channel of a faulting application; the GPU itself stays usable",
    44: "Engine faulted while switching contexts",
    45: "Channels removed as cleanup after another error; an echo of the Xid before it when not alone",
    46: "GPU stopped processing entirely (timeout)",
    48: "Uncorrectable double-bit ECC error in GPU memory; the GPU needs a reset",
    54: "Board is missing auxiliary power and runs at reduced clocks; check the power cables",
    58: "Frame-buffer memory error (legacy)",
    59: "Power-management microcontroller error (legacy)",
    61: "Power-management microcontroller hit a breakpoint (legacy)",
    62: "Internal microcontroller halted; the GPU needs a reset",
    63: "A memory row was remapped or a page retired; reset the GPU when convenient",
    64: "A memory row could not be remapped: the GPU has run out of spare rows and should be replaced",
    66: "Driver made an illegal register access",
    67: "Driver failed a firmware verification check",
    69: "Engine was given a command of a class it does not support",
    74: "NVLink error; decode the register fields, repeats on one link point at cabling or hardware",
    78: "vGPU could not start (host/guest driver mismatch or unsupported profile)",
    79: "GPU has fallen off the bus and no longer answers; the node needs a reboot",
    80: "Data sent to the GPU arrived corrupted (push-buffer CRC mismatch)",
    87: "Driver telemetry report (legacy)",
    92: "Unusually high rate of corrected single-bit ECC errors",
    93: "InfoROM erase limit reached; the board can no longer record retirements",
    94: "Memory error contained to the affected application; restart it",
    95: "Memory error that could not be contained to one application; the GPU needs a reset",
    106: "Out-of-band management test message",
    107: "Out-of-band management test message (silent)",
    108: "NVLink remote address translation fault, usually a bad peer access by the application",
    109: "Context-switch timeout, typically caused by the running application",
    110: "Security engine fault",
    119: "Timed out waiting for the GPU System Processor firmware; reset the GPU",
    120: "GPU System Processor firmware reported an error; reset the GPU",
    121: "Chip-to-chip (C2C) link error on Grace-Hopper/Blackwell",
    136: "NVLink link training failed",
    137: "NVLink privilege violation, usually an illegal peer access",
    140: "Uncorrectable ECC error escaped containment; reset the GPU",
    141: "CUDA fast-path error",
    143: "GPU failed to initialise",
    **{
        code: f"NVLink5 {unit} error; Fatal/Nonfatal and the IntrInfo/ErrorStatus words decide the action"
        for code, unit in zip(
            range(144, 151), ("SAW", "RLW", "TLW", "TREX", "NVLPW_CTRL", "NETIR", "MSE"), strict=True
        )
    },
    151: "Confidential-computing key rotation failed; restart the VM",
    152: "Deep-learning accelerator SMMU error",
    153: "Deep-learning accelerator timeout",
    154: "The driver changed the recovery action it requires (none / GPU reset / node reboot / drain)",
    155: "NVLink error defined by software (e.g. a link disabled on purpose)",
    156: "A memory resource was retired; reset the GPU to apply it",
    157: "A memory resource could not be retired",
    158: "Fatal GPU timeout; reset the GPU",
    159: "Coherent hub interface error without data; usually sympathetic",
    160: "A hardware channel was retired",
    161: "A hardware channel could not be retired",
    162: "Power-smoothing circuitry back in service",
    163: "Power-smoothing circuitry taken out of service",
    164: "Power-smoothing circuitry nearing end of life",
    165: "Power-smoothing circuitry worn out",
    166: "Encrypted NVLink traffic seen before the link was set up for it",
    167: "Fatal PCIe timeout talking to the GPU",
    168: "Errors in the protected memory region reduced the usable GPU memory",
    169: "Security microcontroller halted; reset the GPU",
    170: "Unexpected NVLink interrupt in confidential-computing mode",
    171: "Uncorrectable error located in DRAM (detail for Xid 48)",
    172: "Uncorrectable error located in on-chip SRAM (detail for Xid 48)",
}

_ENGINES = (
    ("_CE", "Copy engine exception"),
    ("NVDEC", "Video decoder exception"),
    ("NVENC", "Video encoder exception"),
    ("NVJPG", "JPEG engine exception"),
    ("OFA", "Optical-flow engine exception"),
    ("SEC2", "Security engine exception"),
)


def classify(code: int, mnemonic: str) -> str:
    if code in CLASS:
        return CLASS[code]
    if any(
        tag in mnemonic for tag in ("_CE", "NVDEC", "NVENC", "NVJPG", "OFA", "_GR_", "FIFO", "SEC2", "DLA")
    ):
        return "application"  # engine exceptions raised on behalf of the running job
    if "SILENT_RUNNING" in mnemonic or "FB_" in mnemonic:
        return "hardware"
    return "firmware_driver"


def describe(code: int, mnemonic: str, in_use: bool) -> str:
    if code in DESCRIPTION:
        return DESCRIPTION[code]
    if not in_use:
        return "Legacy code, not raised by current data-center drivers"
    for tag, words in _ENGINES:
        if tag in mnemonic:
            return f"{words} ({mnemonic.rsplit('_', 2)[-2]}); restart the application"
    return mnemonic.lower()


def severity(code: int, bucket: str, in_use: bool) -> str:
    if code in FATAL or bucket == "RESTART_BM":
        return "fatal"
    if code in ERROR:
        return "error"
    if code in INFO:
        return "info"
    if code == 45 or code in (63, 92) or bucket in ("IGNORE", "CHECK_UVM") or not in_use:
        return "warning"
    if bucket == "RESTART_APP":
        return "warning"
    return "error"


def render(ref: Path) -> str:
    """The project catalog's CSV text for the reference export at ``ref``."""
    rows = list(csv.DictReader(ref.open(newline="", encoding="utf-8")))
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(["code", "mnemonic", "immediate", "investigatory", "generations", "class", "severity",
                  "category", "action", "health", "root_cause", "description"])  # fmt: skip
    for row in rows:
        code = int(row["Code"])
        mnemonic = row["Mnemonic"].strip()
        bucket = row["Resolution Bucket (Immediate Action)"].strip()
        gens = [g for g in GENERATIONS if row[f"Applies to {g}"].strip().upper() == "YES"]
        in_use = bool(gens)
        cls = classify(code, mnemonic)
        level = severity(code, bucket, in_use)
        action = ACTION_NO_BUCKET.get(code) or ACTION.get(bucket, "contact_support")
        health, action = POLICY.get(code, (HEALTH_BY_SEVERITY[level], action))
        health = "" if code in TEXT_DECIDES else health
        category = CATEGORY_OVERRIDE.get(code, CATEGORY[cls])
        out.writerow([code, mnemonic, bucket, row["Resolution Bucket (Investigatory Action)"].strip(),
                      ";".join(gens), cls, level, category, action, health, ROOT_CAUSE.get(code, ""),
                      describe(code, mnemonic, in_use)])  # fmt: skip
    return buf.getvalue()


def main(ref: Path) -> None:
    text = render(ref)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    tmp = OUT.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8", newline="")
    os.replace(tmp, OUT)
    print(f"wrote {OUT.relative_to(ROOT)} ({text.count(chr(10)) - 1} codes)")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_REF)
