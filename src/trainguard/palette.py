"""The colours of health states in a terminal, for every front end (the CLI's tables, the demo's
live panel): rich style names and ANSI SGR codes. Stdlib only.

    >>> STYLE[Health.FAILED], ANSI[Health.FAILED]
    ('bold red', '1;31')
"""

from __future__ import annotations

from trainguard.records import Health

__all__ = ["ANSI", "STYLE"]

STYLE = {
    Health.OK: "green",
    Health.DEGRADED: "yellow",
    Health.FAILED: "bold red",
    Health.UNKNOWN: "magenta",
}
ANSI = {Health.OK: "32", Health.DEGRADED: "33", Health.FAILED: "1;31", Health.UNKNOWN: "35"}
