"""A failed rank's fingerprint, from what any Python process leaves: the crash-loop key for
scripts that never import trainguard.

The Guard writes an error file whose masked `policy.error_signature` drives the crash-loop stop;
a plain script leaves only torchelastic's error file (when its ``main`` carries torch's
``@record``) and its own stderr. `fingerprint` reads, in that order:

1. torchelastic's error file: its ``"ExcType: message"`` and the innermost frame of its callstack;
2. the rank's stderr: the last Python traceback's exception line and innermost frame (a
   ``SyntaxError`` names its file and line without a function);
3. else the last line of stderr that reads as an error (``python: can't open file ...``, our exec
   shim's ``command not found``), with the exit code.

The key is the evidence itself: exception type, message and ``file:line``, with only what differs
between two runs of the same bug masked (hex addresses, pids, ports). Numbers in the message are
kept, so "bad batch at step 120" and "... 240" are two failures, not one. A rank killed by a
signal has no fingerprint, nor has a transport or rendezvous error (gloo's "Connection closed by
peer", ``ncclRemoteError``, a timeout): those follow a peer's or the network's loss, whatever
the script does.

`last_error` reads the same two files for the exception itself, unmasked: what a survivor of a
peer node's loss died of, for `supervisor.peers` to judge.

    >>> fingerprint(1, None, 'Traceback (most recent call last):\\n  File "/x/train.py", line 3, '
    ...             'in <module>\\n    import nosuch\\nModuleNotFoundError: No module named \\'nosuch\\'\\n')
    "ModuleNotFoundError: No module named 'nosuch' @ train.py:3"
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from trainguard.rundir import read_tail

__all__ = ["fingerprint", "last_error", "read_fingerprint", "read_last_error"]

TAIL_BYTES = 64 * 1024  # the end of a rank's stderr: where its last traceback is

_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)')
_EXC = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?::|$)")  # ExcType[: message]
_RANK_TAG = re.compile(r"^\[rank\d+\]: ?")  # torch's prefix on an uncaught exception's lines
# A transport or rendezvous error is what a rank sees when a peer or the network went away: a
# consequence, the same text on every try whoever failed, and not the script's own bug.
_PEER_LOSS = re.compile(
    r"Connection (?:closed|reset) by peer|Connection refused|Broken pipe|ncclRemoteError|ncclSystemError"
    r"|DistNetworkError|DistStoreError|Rendezvous\w*(?:Error|Timeout|Closed)|timed? ?out"
    r"|UnavailableError",  # TensorFlow's gRPC UNAVAILABLE: a peer task it cannot reach
    re.IGNORECASE,
)
_ERRORISH = re.compile(r"error|exception|can't|cannot|not found|no such|fatal|denied", re.IGNORECASE)
_MASKS = (
    (re.compile(r"0x[0-9a-fA-F]+"), "<hex>"),
    (re.compile(r"\b(pid|PID|process)([ =:]+)\d+"), r"\1\2<n>"),
    (re.compile(r"(\d{1,3}(?:\.\d{1,3}){3}|localhost|\]):\d+"), r"\1:<port>"),
)


def read_fingerprint(code: int | None, elastic_error: Path, stderr: Path) -> str | None:
    """`fingerprint` of one rank from its files (a file that cannot be read counts as empty)."""
    return fingerprint(code, _read(elastic_error), read_tail(stderr, TAIL_BYTES))


def read_last_error(elastic_error: Path, stderr: Path) -> str | None:
    """`last_error` of one rank from its files (a file that cannot be read counts as empty)."""
    return last_error(_read(elastic_error), read_tail(stderr, TAIL_BYTES))


def last_error(elastic_error: str | None, stderr_tail: str) -> str | None:
    """The ``"ExcType: message"`` a rank died of, as it left it (unmasked): torchelastic's error
    file's, else its stderr's last traceback's; None when neither holds one.

    >>> last_error(None, '[rank0]: Traceback (most recent call last):\\n[rank0]:   File "t.py", '
    ...            'line 9, in <module>\\n[rank0]: RuntimeError: Connection closed by peer [10.0.0.2]:4')
    'RuntimeError: Connection closed by peer [10.0.0.2]:4'
    """
    found = _from_elastic(elastic_error) if elastic_error else None
    if found is None:
        found = _from_traceback(stderr_tail)
    return found[0] if found is not None else None


def fingerprint(code: int | None, elastic_error: str | None, stderr_tail: str) -> str | None:
    """The crash-loop key of a rank that exited ``code`` (see the module docstring); None when
    the evidence names no failure of the script's own."""
    if code is None or code <= 0:
        return None
    parts = _from_elastic(elastic_error) if elastic_error else None
    if parts is None:
        parts = _from_traceback(stderr_tail)
    found = parts[0] + (f" @ {parts[1]}" if parts[1] else "") if parts is not None else None
    if found is None:
        line = next((ln.strip() for ln in reversed(stderr_tail.splitlines()) if ln.strip()), "")
        if not _ERRORISH.search(line):
            return None
        found = f"exit {code}: {line}"
    if _PEER_LOSS.search(found):
        return None
    return _mask(found)[:400]


def _from_elastic(text: str) -> tuple[str, str | None] | None:
    """(exception line, innermost ``file:line``) of torchelastic's error file."""
    try:
        message = json.loads(text)["message"]
        head, stack = str(message["message"]), str(message.get("extraInfo", {}).get("py_callstack", ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    head = head.strip().splitlines()[0] if head.strip() else ""
    if not head:
        return None
    return head, _innermost(stack.splitlines())


def _from_traceback(text: str) -> tuple[str, str | None] | None:
    """The exception line of the last traceback in ``text`` and the innermost frame above it."""
    lines = [_RANK_TAG.sub("", ln.rstrip(), count=1) for ln in text.splitlines()]
    start = max(
        (i for i, ln in enumerate(lines) if ln.lstrip().startswith("Traceback (most recent")), default=-1
    )
    if start < 0:  # a SyntaxError in the script itself prints no "Traceback" header
        start = max((i for i, ln in enumerate(lines) if _FRAME.match(ln)), default=-1)
        if start < 0:
            return None
    block = lines[start:]
    # The exception line is the first line after the frames that is not indented (a frame's
    # source line and carets are) and reads "ExcType[: message]": any exception class, whatever
    # its name; a native log line written between the frames (TF's "W1128 ...") is not one. Not
    # the line after the last frame: a message may list frames of its own (TF's "defined at").
    end = next((i for i, ln in enumerate(block) if i and ln and not ln[0].isspace() and _EXC.match(ln)), None)
    if end is None:
        return None
    exc = block[end]
    last = max((i for i, ln in enumerate(block[:end]) if _FRAME.match(ln)), default=-1)
    return exc.strip(), _innermost(block[: last + 1])


def _innermost(lines: list[str]) -> str | None:
    frames = [m for ln in lines if (m := _FRAME.match(ln))]
    if not frames:
        return None
    path, line = frames[-1].groups()
    return f"{path.rsplit('/', 1)[-1]}:{line}"


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _mask(text: str) -> str:
    for pattern, repl in _MASKS:
        text = pattern.sub(repl, text)
    return text
