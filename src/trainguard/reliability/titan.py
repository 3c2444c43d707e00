"""The Titan supercomputer's GPU lifetimes (ORNL, 2012-2019) as survival data.

Reads ``gc_summary_loc.csv`` of the public olcf/TitanGPULife data set (one row per GPU serial
number; the authors already dropped service nodes and inconsistent inventory records). A GPU is
dead when it was taken out after a double-bit ECC error (DBE) or after falling off the bus (OTB);
otherwise its lifetime is right-censored at its last inventory. Batches follow the authors' split:
"old" was first installed before 2016, "new" are the replacements installed from 2016 on.

Cite: Ostrouchov, Maxwell, Ashraf, Engelmann, Shankar, Rogers, "GPU Lifetimes on Titan
Supercomputer: Survival Analysis and Reliability", SC '20.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from trainguard.errors import InputError

SUMMARY_FILE = "gc_summary_loc.csv"
SECONDS_PER_YEAR = 365.0 * 86_400.0  # the authors' year: days / 365
LOCATION_FIELDS = ("col", "row", "cage", "slot", "node")


@dataclass(frozen=True, slots=True)
class TitanGpu:
    sn: str
    years: float  # time in service, summed over its locations
    dead: bool
    dbe: bool  # taken out with a double-bit ECC error
    otb: bool  # taken out after falling off the bus
    batch: str  # old | new
    col: int
    row: int
    cage: int  # 0 (bottom) .. 2 (top) of the cabinet: airflow runs bottom to top
    slot: int
    node: int

    @property
    def cause(self) -> str:
        """The failure mode for competing risks: "dbe" (also when it fell off the bus as well),
        "otb", or "" when censored."""
        if not self.dead:
            return ""
        return "dbe" if self.dbe else "otb"


def load_titan(directory: str | Path) -> list[TitanGpu]:
    path = Path(directory) / SUMMARY_FILE
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as exc:
        raise InputError(
            f"cannot read the Titan data {path}: {exc.strerror}; pass --titan DIR, the folder that "
            "holds gc_summary_loc.csv (from github.com/olcf/TitanGPULife, data/)"
        ) from None
    gpus = []
    for i, r in enumerate(rows, start=2):
        try:
            if not r["time"] or not r["col"]:
                continue  # a serial number with no life record: nothing to fit
            gpus.append(
                TitanGpu(
                    sn=r["SN"],
                    years=float(r["time"]) / SECONDS_PER_YEAR,
                    dead=r["dead"] == "TRUE",
                    dbe=r["dead_dbe"] == "TRUE",
                    otb=r["dead_otb"] == "TRUE",
                    batch=r["batch"],
                    **{k: int(r[k]) for k in LOCATION_FIELDS},
                )
            )
        except (KeyError, ValueError) as exc:
            raise InputError(f"{path}, line {i}: not the TitanGPULife summary format ({exc!r})") from None
    if not gpus:
        raise InputError(f"{path} holds no GPU lifetimes")
    return gpus
