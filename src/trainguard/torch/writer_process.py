"""The background writer process: ``python -m trainguard.torch.writer_process FD``, started by
``trainguard.torch.async_writer.BackgroundWriter`` only (FD: its end of a Unix socket pair).

It maps the staging buffer it is sent, and for each save builds tensors over that memory,
``torch.save``s them through a checksumming sink, commits and applies retention, then answers
``{"ok": True, "result": ...}`` or ``{"ok": False, "error": ..., "traceback": ...}``.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import sys
import traceback
from pathlib import Path

from trainguard.procs import die_with_parent, install
from trainguard.torch.async_writer import recv_msg, send_msg


def main(argv: list[str]) -> int:
    sock = socket.socket(fileno=int(argv[0]))
    # Under torchrun a preemption SIGTERM (or a terminal's Ctrl-C) reaches the whole process
    # group, writer included, at the very moment the trainer wants its final checkpoint written.
    # The writer leaves only when its parent does, never on its own signal.
    install((signal.SIGTERM, signal.SIGINT), signal.SIG_IGN, take_foreign=True)
    die_with_parent(os.getppid(), poll_s=0.2)
    import mmap

    import torch

    from trainguard.checkpoint.signing import Key
    from trainguard.torch.staging import SlotSpec, slot_views, unflatten
    from trainguard.torch.writer import write_replicated

    torch.set_num_threads(1)
    view: memoryview | None = None
    while True:
        try:
            msg, fds = recv_msg(sock)
        except (EOFError, OSError):
            return 0
        op = msg.get("op")
        if op == "exit":
            return 0
        if op == "buffer":
            view = memoryview(mmap.mmap(fds[0], msg["size"]))
            os.close(fds[0])
            continue
        if op != "save":
            continue
        try:
            if view is None:
                raise RuntimeError("no staging buffer was sent before the save")
            specs = [SlotSpec(*s) for s in msg["slots"]]
            payload = unflatten(pickle.loads(msg["skeleton"]), slot_views(view, specs))
            result = write_replicated(
                Path(msg["directory"]),
                msg["step"],
                payload,
                world_size=msg["world_size"],
                keep_last=msg["keep_last"],
                milestone_every=msg["milestone_every"],
                key=Key(bytes.fromhex(msg["key"])),  # the trainer's signing key, sent over our socket
                encrypt=msg["encrypt"],
            )
            del payload
            send_msg(sock, {"ok": True, "result": result})
        except Exception as exc:
            send_msg(sock, {"ok": False, "error": repr(exc), "traceback": traceback.format_exc()})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
