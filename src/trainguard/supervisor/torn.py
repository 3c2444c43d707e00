"""Why a committed checkpoint fails verification, from what the verification found (pure).

A checkpoint is committed by an atomic rename after its files and then its manifest were written
and fsync'd (`checkpoint.atomic.commit`): a writer killed mid-save leaves a ``.tmp-`` directory
that no reader lists. So a committed checkpoint that no longer verifies was torn afterwards or
below the writer, and what the verification found tells the two cases apart:

- every file there with its recorded size, but different bytes (a checksum mismatch): the data
  changed at rest, storage's doing (``dependency``: a disk, a filesystem, a storage service);
- a file or the manifest missing, or shorter or longer than recorded: the save never reached the
  disk whole: the writer was killed (a crash, a power loss) before storage kept what it had
  acknowledged, or a writer published before its data was durable. Nothing here says which:
  ``unknown``, with both suspects.

    >>> torn_cause("checksum mismatch in state.pt: expected crc32 1, found 2")[0].value
    'dependency'
    >>> torn_cause("size mismatch in state.pt: expected 100 bytes, found 40")[0].value
    'unknown'
"""

from __future__ import annotations

from trainguard.incidents import RootCause, suspects

_AT_REST = ("checksum mismatch",)
_INCOMPLETE = ("no manifest.json", "missing file", "size mismatch", "manifest lists no files")


def torn_cause(reason: str) -> tuple[RootCause, tuple[str, ...]]:
    """The root cause of a committed checkpoint failing verification for ``reason`` (what
    `checkpoint.verify` said), and the evidence line that explains it."""
    if reason.startswith(_AT_REST):
        return RootCause.DEPENDENCY, (
            "every file is there with the size its manifest records, but its bytes changed after the "
            "save was committed: storage corrupted it at rest",
        )
    if reason.startswith(_INCOMPLETE):
        return RootCause.UNKNOWN, (
            suspects(
                (
                    RootCause.HOST,
                    "the writer was killed mid-save (crash, power loss) before storage kept its data",
                ),
                (
                    RootCause.SOFTWARE_BUG,
                    "a writer that published the checkpoint before its data was durable",
                ),
            ),
        )
    return RootCause.UNKNOWN, (
        suspects(
            (RootCause.DEPENDENCY, "storage could not be read"),
            (RootCause.SOFTWARE_BUG, "a writer that wrote a bad manifest"),
        ),
    )
