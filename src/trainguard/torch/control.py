"""The supervisor's requests, as the Guard reads them at its step boundary (`trainguard.control`).

Part of the Guard (``trainguard.torch.guard``). Every ``control_every`` steps the boundary looks
at the control file (one ``stat``); a checkpoint request this rank's checkpoints have not served
yet makes ``pending`` true. The Guard then agrees on it with the other ranks (the window's
checkpoint flag: every rank saves at the same step) and saves; any save serves every request
written until it was taken. A request for another attempt (one the supervisor has restarted
since) is not this attempt's to serve.
"""

from __future__ import annotations

from pathlib import Path

from trainguard.control import ControlWatch

__all__ = ["SaveRequests"]


class SaveRequests:
    def __init__(self, run_dir: Path, every: int, attempt: int) -> None:
        self.watch = ControlWatch(run_dir)
        self.every, self.attempt = every, attempt
        self.served: int | None = None  # the newest request value a checkpoint has served
        self.pending = False  # a request this rank saw that no checkpoint has served yet
        self.reason = ""

    def look(self, done: int) -> bool:
        """At the boundary after ``done`` steps: whether a request is pending (it looks at the
        file every ``every`` steps)."""
        if done % self.every == 0:
            control = self.watch.poll()
            if (
                control is not None
                and control.save_now is not None
                and control.save_now != self.served
                and control.attempt in (None, self.attempt)
            ):
                self.pending, self.reason = True, control.reason
        return self.pending

    def served_now(self) -> None:
        """A checkpoint was just taken: it serves every request written so far."""
        self.watch.poll()
        current = self.watch.current
        if current is not None and current.save_now is not None:
            self.served = current.save_now
        self.pending = False
