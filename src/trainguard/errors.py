"""trainguard's exceptions, drawn as a tree. Hardware problems are findings, not exceptions:
these are for the tool itself not being able to do what it was asked.

    TrainguardError
    ├── ConfigError(ValueError)            bad configuration, flag, scenario or plan file
    ├── InputError(ValueError)             a user file that cannot be read or parsed
    ├── BackendError(RuntimeError)         a telemetry backend cannot serve
    │   ├── BackendUnavailable             no driver / library / GPU: suggest --backend sim
    │   ├── GpuLost                        one GPU stopped answering (becomes a finding)
    │   ├── NotSupported                   a field this GPU does not have (becomes "unknown")
    │   └── NoPermission                   the driver refused the query
    ├── CheckpointError(RuntimeError)      checkpoint I/O
    │   ├── CheckpointCorrupt              a checkpoint failed verification (skipped on load)
    │   └── NoValidCheckpoint              nothing valid to resume from
    ├── StoreError(RuntimeError)           the incident store
    │   └── StoreUnavailable               the database cannot be reached (writers spool and retry)
    ├── SupervisorError(RuntimeError)      launching or watching training
    │   └── CrashLoop                      the same application error keeps repeating
    └── MissingDependency(ImportError)     an optional extra is not installed: pip install 'trainguard[x]'

Third-party errors (every pynvml NVMLError_*, sqlite3 errors...) are mapped at the boundary
where they occur, so callers only ever see this tree.
"""

from __future__ import annotations


class TrainguardError(Exception):
    """Base of every error trainguard raises on purpose."""


class ConfigError(TrainguardError, ValueError):
    """A configuration value, flag, scenario or plan is wrong; the message says what to fix."""


class InputError(TrainguardError, ValueError):
    """A user-provided file cannot be read or parsed; the message names the file."""


class BackendError(TrainguardError, RuntimeError):
    """A telemetry backend cannot serve a request."""


class BackendUnavailable(BackendError):
    """No driver, library or GPU: the backend cannot start at all."""


class GpuLost(BackendError):
    """One GPU stopped answering; the backend keeps serving the others."""


class NotSupported(BackendError):
    """The GPU or driver does not have this field; the reading becomes unknown."""


class NoPermission(BackendError):
    """The driver refused a query for lack of permission."""


class CheckpointError(TrainguardError, RuntimeError):
    """A checkpoint could not be written or read."""


class CheckpointCorrupt(CheckpointError):
    """A checkpoint failed verification (torn, truncated or bit-flipped)."""


class NoValidCheckpoint(CheckpointError):
    """No valid checkpoint exists to resume from."""


class StoreError(TrainguardError, RuntimeError):
    """The incident store cannot be opened or written."""


class StoreUnavailable(StoreError):
    """The store's database cannot be reached now (server down, network, locked, disk full)."""


class SupervisorError(TrainguardError, RuntimeError):
    """The supervisor cannot launch or watch training."""


class CrashLoop(SupervisorError):
    """The same application error repeated: restarting again would only loop."""


class MissingDependency(TrainguardError, ImportError):
    """A feature needs an optional extra that is not installed; the message names the pip command."""
