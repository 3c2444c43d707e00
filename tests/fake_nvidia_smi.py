"""A stand-in for ``nvidia-smi`` that answers the calls trainguard's ``NvidiaSmi`` makes as the
real tool does, and records every argument list.

    FAKE_SMI_STATE=state.json FAKE_SMI_LOG=calls.jsonl python tests/fake_nvidia_smi.py -r -i 1

The state file (JSON) holds, per GPU index: ``bus`` (``00000000:1A:00.0``), ``persistence``
(bool), ``processes`` ([[pid, MiB]]), ``reset`` (``ok`` | ``unsupported`` | ``busy``: another
client such as Fabric Manager holds it) and ``lost`` (fallen off the bus). The answers and exit
codes are those NVIDIA's tool gives (its man page's return codes: 3 not available on the target
device, 15 the GPU has fallen off the bus, 255 other error; the texts as reported in NVIDIA's docs
and issue threads):

- a reset refused while persistence mode or another client holds the GPU ("The following GPUs
  could not be reset: ... In use by another client", exit 255), a reset the board does not
  support ("Resetting GPU ... is not supported.", exit 3; NVIDIA's MIG guide), a success ("GPU
  ... was successfully reset.", exit 0);
- ``-pm 0|1`` ("Disabled persistence mode for GPU ....", "All done."); a lost GPU answers
  "Unable to determine the device handle for GPU ...: GPU is lost." with exit 15.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

IN_USE = (
    "The following GPUs could not be reset:\n  GPU {bus}: In use by another client\n\n"
    "1 device is currently being used by one or more other processes (e.g., Fabric Manager, CUDA "
    "application, graphics application such as an X server, or a monitoring application such as "
    "another instance of nvidia-smi). Please first kill all processes using this device and all "
    "compute applications running in the system.\n"
)


def main(argv: list[str]) -> int:
    state_path = Path(os.environ["FAKE_SMI_STATE"])
    state = json.loads(state_path.read_text())
    with open(os.environ["FAKE_SMI_LOG"], "a") as log:
        log.write(json.dumps(argv) + "\n")
    index = argv[argv.index("-i") + 1] if "-i" in argv else "0"
    gpu = state.get(index)
    if gpu is None:
        print(f"No devices were found matching the identifier {index}")  # real: exit 6
        return 6
    bus = gpu["bus"]
    if gpu.get("lost"):
        print(
            f"Unable to determine the device handle for GPU {bus}: GPU is lost.  Reboot the system to recover this GPU"
        )
        return 15
    if argv[0].startswith("--query-compute-apps"):
        for pid, mib in gpu.get("processes", []):
            print(f"{pid}, {mib}")
        return 0
    if argv[0] == "--query-gpu=persistence_mode":
        print("Enabled" if gpu["persistence"] else "Disabled")
        return 0
    if argv[0] == "--query-gpu=index":
        print(index)
        return 0
    if argv[0] == "-pm":
        gpu["persistence"] = argv[1] == "1"
        state_path.write_text(json.dumps(state))
        print(f"{'Enabled' if gpu['persistence'] else 'Disabled'} persistence mode for GPU {bus}.")
        print("All done.")
        return 0
    if argv[0] == "-r":
        if gpu.get("reset") == "unsupported":
            print(f"Resetting GPU {bus} is not supported.")
            return 3
        if gpu["persistence"] or gpu.get("reset") == "busy" or gpu.get("processes"):
            print(IN_USE.format(bus=bus), end="")
            return 255
        gpu["resets"] = gpu.get("resets", 0) + 1
        state_path.write_text(json.dumps(state))
        print(f"GPU {bus} was successfully reset.")
        return 0
    print(f"fake nvidia-smi: no answer written for {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
