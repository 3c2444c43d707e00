"""Which ranks stalled a job, from torch's flight-recorder dumps (one ``<prefix><rank>`` file per rank).

Where it sits: ``trainguard.torch.flight_recorder`` loads the dumps with torch's own reader into
`FlightDump`s; this module judges them (pure, stdlib only); ``logs explain`` and the supervisor's
hang forensics print and store the `FlightVerdict`.

The judgement, per process group (collectives matched by ``collective_seq_id``, send/recv by peer):

1. where the group stopped agreeing: the newest collective any member issued; a member is a
   *blocker* of the group when it has no dump (dead, or hung holding the GIL so it could not
   answer), never issued that collective, issued it with other sizes/types than the others
   (torch's matcher decides), or (NCCL) never started it while the others did;
2. a blocker is a *victim* when its own last operation waits in another stalled group (or was
   released from one by an error): the stall came from there, so follow it;
3. the culprits are the blockers that are not victims. Every rank that waits only because of
   another is left out. In a cycle with no culprit (ranks waiting on each other in two groups) the
   order of collectives decides (``incidents.flight_order``): a rank of the cycle whose next
   collective differs from the one most ranks issued next skipped, added or swapped one, and is
   named (``collective_desync``); without such a rank no one is named and the cycle's ranks are
   suspects (category ``unknown``). Likewise a size/type mismatch with as many ranks on each side
   names no one: both sides are suspects. A false culprit is a wrong action (a healthy GPU
   excluded), so what the evidence cannot decide stays unknown; nothing that stands out names no
   one;
4. a rank that completed a collective and issued nothing since, while most ranks that completed it
   went on (``incidents.flight_order.stopped``), stopped outside communication even where no group
   shows it (its next group's peers are all held by another culprit), and is named too;
5. a rank that entered a group's last collective late, on its own time (``incidents.late``: the
   entry times show it free long before it entered, where its peers in that step entered at once),
   is named too, as ``late`` (it joined in the end, so the stall does not wait on it: `causes`
   leaves it out). Entries of groups no pg_config lists (gloo's own dumps) get their members from
   the entries, the default group every rank.

>>> d0 = FlightDump(0, "r0", {"0": ("default_pg", (0, 1))}, [entry("0", 1, "all_reduce", done=False)])
>>> d1 = FlightDump(1, "r1", {"0": ("default_pg", (0, 1))}, [])
>>> judge([d0, d1]).ranks
(1,)
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.incidents.flight_order import deviants, stopped
from trainguard.incidents.late import Timed, late_ranks
from trainguard.incidents.late import describe as describe_late

__all__ = ["FlightDump", "FlightVerdict", "RankEvidence", "dump_files", "entry", "judge"]

Matcher = Callable[[dict[str, Any], dict[str, Any], set[int]], "str | None"]

NO_DUMP = "no_dump"  # the culprit categories, strongest evidence last
NOT_ISSUED = "not_issued"
NOT_STARTED = "not_started"
MISMATCH = "collective_mismatch"
DEADLOCK = "collective_order_deadlock"
DESYNC = "collective_desync"  # left the order of collectives every other rank followed
LATE = "late"  # entered the group's last collective late, on its own time (``incidents.late``)
_CATEGORY = {  # culprit kind -> root_cause.category when all culprits agree
    NO_DUMP: "rank_unresponsive",
    NOT_ISSUED: "rank_stalled_outside_collective",
    NOT_STARTED: "gpu_not_progressing",
    MISMATCH: "collective_mismatch",
    DEADLOCK: "collective_order_deadlock",
    DESYNC: "collective_desync",
    LATE: "rank_late",  # only when no rank is named for anything else
}


@dataclass(frozen=True, slots=True)
class FlightDump:
    """One rank's dump: its process groups (name -> (desc, global ranks)) and its entries (torch's
    dicts, oldest first)."""

    rank: int
    path: str
    groups: dict[str, tuple[str, tuple[int, ...]]]
    entries: list[dict[str, Any]]
    version: str = ""

    @classmethod
    def from_torch(cls, rank: int, path: str, data: dict[str, Any]) -> FlightDump:
        groups: dict[str, tuple[str, tuple[int, ...]]] = {}
        for name, cfg in (data.get("pg_config") or {}).items():
            try:
                ranks = cfg["ranks"]
                ranks = ast.literal_eval(ranks) if isinstance(ranks, str) else ranks
                if ranks:
                    groups[str(name)] = (str(cfg.get("desc", "")), tuple(sorted(int(r) for r in ranks)))
            except (KeyError, ValueError, TypeError, SyntaxError):
                continue
        entries = [e for e in data.get("entries") or [] if isinstance(e, dict) and "process_group" in e]
        entries.sort(key=lambda e: e.get("record_id", 0))
        return cls(rank, path, groups, entries, str(data.get("version", "")))


@dataclass(frozen=True, slots=True)
class RankEvidence:
    rank: int
    kind: str  # NO_DUMP | NOT_ISSUED | NOT_STARTED | MISMATCH | DEADLOCK
    group: str  # "tp (pg 1, ranks 0-3)"
    op: str  # "all_reduce #7"
    text: str


@dataclass(frozen=True, slots=True)
class FlightVerdict:
    ranks: tuple[int, ...]  # every culprit rank, no victim
    category: str  # see _CATEGORY; "multiple" when culprits differ; "unknown" when only suspects
    # stand out (the evidence cannot decide between them); "none" when nothing stands out
    evidence: dict[int, list[RankEvidence]] = field(default_factory=dict)
    victims: tuple[int, ...] = ()  # ranks that wait because of a culprit
    stalled_groups: tuple[str, ...] = ()
    dumps: int = 0
    notes: tuple[str, ...] = ()
    late: tuple[int, ...] = ()  # ranks named only for entering late (they joined in the end)
    suspects: dict[int, list[RankEvidence]] = field(default_factory=dict)  # the evidence can't tell

    @property
    def causes(self) -> tuple[int, ...]:
        """The culprits the stall waits on: `ranks` less those named only for being late."""
        return tuple(r for r in self.ranks if r not in self.late)

    def as_json(self) -> dict[str, Any]:
        return {
            "ranks": list(self.ranks),
            "category": self.category,
            "evidence": {
                str(r): [{"kind": e.kind, "group": e.group, "op": e.op, "text": e.text} for e in ev]
                for r, ev in sorted(self.evidence.items())
            },
            "victims": list(self.victims),
            "stalled_groups": list(self.stalled_groups),
            "dumps": self.dumps,
            "notes": list(self.notes),
            "late": list(self.late),
            "suspects": {
                str(r): [{"kind": e.kind, "group": e.group, "op": e.op, "text": e.text} for e in ev]
                for r, ev in sorted(self.suspects.items())
            },
        }


def entry(pg: str, seq: int, op: str, done: bool = True, sizes: Any = ((4,),), **more: Any) -> dict[str, Any]:
    """A flight-recorder entry in torch's shape (for examples and hand-made cases)."""
    return {"process_group": (pg, more.pop("desc", "")), "collective_seq_id": seq, "p2p_seq_id": 0,
            "profiling_name": f"nccl:{op}", "state": "completed" if done else "scheduled",
            "input_sizes": [list(s) for s in sizes], "output_sizes": [list(s) for s in sizes],
            "input_dtypes": ["Float"], "output_dtypes": ["Float"], "is_p2p": op.startswith(("send", "recv")),
            "retired": done, "record_id": more.pop("record_id", seq), **more}  # fmt: skip


_DUMP_NAME = re.compile(r"^(?P<prefix>.*?)(?P<rank>\d+)$")


def dump_files(directory: Path, prefix: str | None = None) -> dict[int, Path]:
    """rank -> dump file under ``directory``: files named ``<prefix><rank>`` holding a pickle or a
    JSON object with ``entries``. Without ``prefix`` the commonest prefix among such files wins."""
    by_prefix: dict[str, dict[int, Path]] = {}
    paths = [directory] if directory.is_file() else sorted(p for p in directory.rglob("*") if p.is_file())
    for path in paths:
        m = _DUMP_NAME.match(path.name)
        if not m or (prefix is not None and m["prefix"] != prefix) or not _looks_like_dump(path):
            continue
        by_prefix.setdefault(str(path.parent / m["prefix"]), {})[int(m["rank"])] = path
    if not by_prefix:
        return {}
    return max(by_prefix.values(), key=len)


def _looks_like_dump(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    if head[:1] == b"\x80":  # pickle protocol 2+
        return b"entries" in head or b"pg_config" in head or b"version" in head
    return head[:1] == b"{" and (b'"entries"' in head or b'"pg_config"' in head)


# -- the judgement -------------------------------------------------------------------------


@dataclass(slots=True)
class _Op:
    rank: int
    key: tuple[str, tuple[int, ...]]  # the group: (pg name, members)
    kind: str  # "coll" | "p2p"
    seq: int
    name: str  # all_reduce, send, recv
    peer: int | None  # global peer of a send/recv
    done: bool
    started: bool
    raw: dict[str, Any]


def _parse(dump: FlightDump, fallback: dict[str, tuple[int, ...]]) -> list[_Op]:
    ops = []
    for e in dump.entries:
        pg = str(e["process_group"][0])
        members = dump.groups[pg][1] if pg in dump.groups else fallback.get(pg, ())
        name = str(e.get("profiling_name", "?")).split(":", 1)[-1]
        op, _, meta = name.partition(" ")
        p2p = bool(e.get("is_p2p")) or op in ("send", "recv")
        peer = None
        if p2p and meta:
            local = int(re.split(r"->|<-", meta)[1])  # send a->b and recv a<-b: the peer is b
            peer = members[local] if 0 <= local < len(members) else None
        state = str(e.get("state", ""))
        done = state == "completed" or bool(e.get("retired"))
        started = state in ("started", "completed") or done
        seq = int(e.get("p2p_seq_id" if p2p else "collective_seq_id") or 0)
        ops.append(_Op(dump.rank, (pg, members), "p2p" if p2p else "coll", seq, op, peer, done, started, e))
    return ops


def _guess_members(by_rank: dict[int, FlightDump], world: set[int]) -> dict[str, tuple[int, ...]]:
    """Members of the groups that entries name but no dump's pg_config lists: the ranks whose
    entries name them; the default group (pg "0", ``default_pg``) has every rank."""
    known = {pg for d in by_rank.values() for pg in d.groups}
    everyone = world | set(by_rank) | {m for d in by_rank.values() for _, ms in d.groups.values() for m in ms}
    seen: dict[str, set[int]] = {}
    for d in by_rank.values():
        for e in d.entries:
            pg = str(e["process_group"][0])
            if pg in known:
                continue
            default = pg == "0" or str(e["process_group"][1]) == "default_pg"
            seen.setdefault(pg, set()).update(everyone if default else {d.rank})
    return {pg: tuple(sorted(rs)) for pg, rs in seen.items()}


def _describe(key: tuple[str, tuple[int, ...]], descs: dict[tuple[str, tuple[int, ...]], str]) -> str:
    pg, members = key
    span = (
        f"{members[0]}-{members[-1]}"
        if members == tuple(range(members[0], members[-1] + 1))
        else str(list(members))
    )
    return f"{descs.get(key) or 'group'} (pg {pg}, ranks {span})" if members else f"pg {pg}"


def _sig(e: dict[str, Any]) -> tuple[str, str, str]:
    return (
        str(e.get("profiling_name", "")).split(":")[-1],
        str(e.get("input_sizes")),
        str(e.get("input_dtypes")),
    )


def judge(
    dumps: Iterable[FlightDump],
    matcher: Matcher | None = None,
    world: Iterable[int] = (),
    here: Iterable[int] | None = None,
) -> FlightVerdict:
    """The culprit ranks of a stalled job (see the module docstring). ``matcher`` compares two
    ranks' entries of one collective (``torch_matcher``); ``world`` adds ranks known to exist;
    ``here``, when given, are the only ranks whose dumps these can be (one node's supervisor sees
    its own ranks): another rank's missing dump is no evidence."""
    by_rank = {d.rank: d for d in dumps}
    notes: list[str] = []
    fixed = _guess_members(by_rank, set(world))
    if fixed:
        notes.append(
            f"pg_config lists no members of groups {sorted(fixed)} (gloo without trainguard's writer): "
            "members guessed from the entries (the default group: every rank)"
        )
    ops = {r: _parse(d, fixed) for r, d in by_rank.items()}
    descs: dict[tuple[str, tuple[int, ...]], str] = {}
    for d in by_rank.values():
        for pg, (desc, members) in d.groups.items():
            descs[(pg, members)] = desc
    for rops in ops.values():
        for o in rops:
            descs.setdefault(o.key, str(o.raw["process_group"][1]))
    all_ranks = set(world) | set(by_rank) | {m for key in descs for m in key[1]}
    away = frozenset() if here is None else frozenset(all_ranks - set(here) - set(by_rank))
    if away:
        notes.append(
            f"ranks {_span(sorted(away))} dump elsewhere (other nodes): a stall on them names no one here"
        )

    blockers: dict[int, list[RankEvidence]] = {}
    suspects: dict[int, list[RankEvidence]] = {}
    stall_at: dict[tuple[str, tuple[int, ...]], int] = {}  # group -> seq it stopped agreeing at
    quiet: dict[tuple[str, tuple[int, ...]], int] = {}  # group whose only oddity is a missing dump
    for key in descs:
        _judge_group(key, ops, by_rank, descs, matcher, blockers, stall_at, quiet, away, suspects)
    _judge_p2p(ops, by_rank, descs, blockers, away)

    def waits_elsewhere(r: int) -> str | None:
        """Where rank r's last operation waits, or was released from by an error (a collective of
        a stalled group, or of one with a member that left no dump), if anywhere."""
        if r not in ops or not ops[r]:
            return None
        last = ops[r][-1]
        if not last.done:
            return _describe(last.key, descs)
        if last.kind == "coll" and stall_at.get(last.key) == last.seq:
            return _describe(last.key, descs) + f" (its {last.name} #{last.seq} ended, the group's did not)"
        if last.kind == "coll" and quiet.get(last.key) == last.seq:
            group = _describe(last.key, descs)
            for m in last.key[1]:
                if m not in by_rank and m not in away:
                    text = f"no flight-recorder dump; rank {r} stopped after {last.name} #{last.seq} with it"
                    blockers.setdefault(m, []).append(
                        RankEvidence(m, NO_DUMP, group, f"{last.name} #{last.seq}", text)
                    )
            return group + f" (stopped after {last.name} #{last.seq})"
        return None

    culprits: dict[int, list[RankEvidence]] = {}
    victims = set()
    for r in sorted(blockers):
        evs = blockers[r]
        hard = [e for e in evs if e.kind in (NO_DUMP, MISMATCH, NOT_STARTED)]
        where = None if hard else waits_elsewhere(r)
        if hard or where is None:
            culprits[r] = hard or evs
        else:
            victims.add(r)
    for r, evs in blockers.items():  # NO_DUMP blockers added while following the dependencies
        if r not in culprits and r not in victims:
            culprits[r] = evs
    waiting = {r for r, rops in ops.items() if rops and not rops[-1].done}
    victims |= waiting - set(culprits)
    colls = {r: [o for o in rops if o.kind == "coll"] for r, rops in ops.items()}
    finished = {(o.key, o.seq) for cs in colls.values() for o in cs if o.done}
    # Completed for every member, each with a dump: an error releases a rank from a collective too
    # (a dead peer), which leaves the collective pending, or undumped, on another member.
    agreed = {
        (key, seq)
        for key, seq in finished
        if all(m in colls and any(o.key == key and o.seq == seq and o.done for o in colls[m]) for m in key[1])
    }
    held = stopped(
        {
            r: [((descs.get(o.key) or "", o.seq), (o.key, o.seq) in agreed) for o in cs]
            for r, cs in colls.items()
        }
    )
    for r, why in held.items():  # stopped where no group shows it (its next group's peers are held)
        if r not in culprits:
            last = colls[r][-1]
            text = f"{why}: stopped outside communication"
            culprits[r] = [
                RankEvidence(r, NOT_ISSUED, _describe(last.key, descs), f"{last.name} #{last.seq}", text)
            ]
            victims.discard(r)
    if not culprits and blockers:  # everyone blocking waits on someone else: a cycle
        cycle = {r: RankEvidence(r, DEADLOCK, e[0].group, e[0].op, e[0].text + f"; itself waits in {waits_elsewhere(r)}")
                 for r, e in blockers.items()}  # fmt: skip
        order = deviants(
            {
                r: [(descs.get(o.key) or "", o.seq) for o in rops if o.kind == "coll"]
                for r, rops in ops.items()
            }
        )
        culprits = {r: [RankEvidence(r, DESYNC, ev.group, ev.op, f"{order[r]}; {ev.text}")]
                    for r, ev in cycle.items() if r in order}  # fmt: skip
        if not culprits:  # a cycle no rank's order explains: the evidence cannot decide
            suspects.update({r: [ev] for r, ev in cycle.items()})
            notes.append(
                f"ranks {sorted(cycle)} wait on each other; no rank left the order the others followed"
            )
        victims = (victims | set(cycle)) - set(culprits) - set(suspects)
    silent = sorted(set(all_ranks) - set(by_rank) - set(culprits) - away)
    if not culprits and not suspects and silent and by_rank:
        for r in silent:
            text = "no flight-recorder dump while every other rank left one; no group shows a stall"
            culprits[r] = [RankEvidence(r, NO_DUMP, "-", "-", text)]
        silent = []
    late = _late(ops, descs, culprits, victims, suspects)
    kinds = {e[0].kind for r, e in culprits.items() if r not in late}
    if culprits:
        category = _CATEGORY[kinds.pop() if kinds else LATE] if len(kinds) <= 1 else "multiple"
    elif any(e.kind != LATE for evs in suspects.values() for e in evs):
        category = "unknown"
    else:
        category = "none"
        if waiting:
            notes.append(
                f"ranks {sorted(waiting)} wait in collectives every member issued: transport or GPU, no rank stands out"
            )
    if silent:
        notes.append(f"no dump from ranks {silent}, which no stalled group waits on")
    return FlightVerdict(
        ranks=tuple(sorted(culprits)),
        category=category,
        evidence=culprits,
        victims=tuple(sorted(victims - set(culprits))),
        stalled_groups=tuple(sorted(_describe(k, descs) + f" at #{s}" for k, s in stall_at.items())),
        dumps=len(by_rank),
        notes=tuple(notes),
        late=tuple(sorted(late)),
        suspects=suspects,
    )


def _late(
    ops: dict[int, list[_Op]],
    descs: dict[tuple[str, tuple[int, ...]], str],
    culprits: dict[int, list[RankEvidence]],
    victims: set[int],
    suspects: dict[int, list[RankEvidence]],
) -> set[int]:
    """Add the ranks that entered a group's last collective late to ``culprits`` (a victim that was
    late is no victim), those that may have been to ``suspects``; returns those named for nothing
    else."""
    timelines = {
        r: [
            Timed(o.key, descs.get(o.key, ""), o.seq if o.kind == "coll" else 0,
                  _ns(o.raw.get("time_created_ns")), _ns(o.raw.get("time_discovered_completed_ns")))
            for o in rops
        ]
        for r, rops in ops.items()
    }  # fmt: skip
    only = set()
    for found in late_ranks(timelines):
        name = next(o.name for o in ops[found.rank] if o.key == found.key and o.seq == found.seq)
        group, op = _describe(found.key, descs), f"{name} #{found.seq}"
        ev = RankEvidence(found.rank, LATE, group, op, describe_late(found, op))
        if found.own_s is None:
            if found.rank not in culprits:
                suspects.setdefault(found.rank, []).append(ev)
            continue
        if found.rank in culprits:  # named for something else too
            culprits[found.rank].append(ev)
        else:
            culprits[found.rank] = [ev]
            only.add(found.rank)
        victims.discard(found.rank)
    return only


def _span(ranks: list[int]) -> str:
    return f"{ranks[:8]}" + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


def _ns(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _judge_group(
    key: tuple[str, tuple[int, ...]],
    ops: dict[int, list[_Op]],
    by_rank: dict[int, FlightDump],
    descs: dict[tuple[str, tuple[int, ...]], str],
    matcher: Matcher | None,
    blockers: dict[int, list[RankEvidence]],
    stall_at: dict[tuple[str, tuple[int, ...]], int],
    quiet: dict[tuple[str, tuple[int, ...]], int],
    away: frozenset[int] = frozenset(),
    suspects: dict[int, list[RankEvidence]] | None = None,
) -> None:
    members = key[1]
    mine = {r: [o for o in ops[r] if o.key == key and o.kind == "coll"] for r in members if r in ops}
    issued = {r: max((o.seq for o in os_), default=0) for r, os_ in mine.items()}
    if not issued or max(issued.values()) == 0:
        return
    top = max(issued.values())
    by_seq: dict[int, dict[int, _Op]] = {}  # seq -> rank -> entry (one pass: a job has 10^4 ranks)
    for r, os_ in mine.items():
        for o in os_:
            by_seq.setdefault(o.seq, {})[r] = o
    for seq in sorted(by_seq):  # the first disagreement in sizes/types
        here = by_seq[seq]
        if _mismatch(
            here,
            key,
            _describe(key, descs),
            f"{next(iter(here.values())).name} #{seq}",
            matcher,
            blockers,
            {} if suspects is None else suspects,
        ):
            stall_at[key] = seq
            return
    pending = sorted({o.seq for os_ in mine.values() for o in os_ if not o.done})
    behind = [r for r in members if r in by_rank and issued.get(r, 0) < top]
    if not behind and not pending:
        if any(r not in by_rank and r not in away for r in members):
            quiet[key] = top
        return
    seq = top if behind or pending[-1] == top else pending[0]
    stall_at[key] = seq
    group = _describe(key, descs)
    here = by_seq[seq]
    ref = next(iter(here.values()))
    opname = f"{ref.name} #{seq}"
    waiting = sorted(r for r, o in here.items() if not o.done)
    others = f"ranks {waiting} wait in it" if waiting else "the others issued it"
    for r in members:
        if r in away:
            continue
        if r not in by_rank:
            text = f"no flight-recorder dump (process dead, or hung holding the GIL); {others}"
            blockers.setdefault(r, []).append(RankEvidence(r, NO_DUMP, group, opname, text))
        elif r not in here:
            last = (
                f"its last in this group was #{issued.get(r, 0)}"
                if issued.get(r)
                else "it issued none in this group"
            )
            idle = (
                ""
                if any(not o.done for o in ops[r])
                else "; nothing of its own is pending: outside communication"
            )
            text = f"never issued {ref.name} #{seq}; {last}; {others}{idle}"
            blockers.setdefault(r, []).append(RankEvidence(r, NOT_ISSUED, group, opname, text))
    started = {r for r, o in here.items() if o.started}
    if started and len(started) < len(here) and all(not o.done for o in here.values()):
        for r in sorted(set(here) - started):
            text = f"issued {ref.name} #{seq} but its GPU never started it; ranks {sorted(started)} did"
            blockers.setdefault(r, []).append(RankEvidence(r, NOT_STARTED, group, opname, text))


def _mismatch(
    here: dict[int, _Op],
    key: tuple[str, tuple[int, ...]],
    group: str,
    opname: str,
    matcher: Matcher | None,
    blockers: dict[int, list[RankEvidence]],
    suspects: dict[int, list[RankEvidence]],
) -> bool:
    """The ranks whose entry of this collective differs from the majority's; with as many ranks
    on each side, every rank of both sides is a suspect (either side may be wrong)."""
    if len(here) < 2:
        return False
    counts = Counter(_sig(o.raw) for o in here.values())
    if len(counts) == 1:
        return False
    found = False
    (common, n), *rest = counts.most_common()
    tie = rest and rest[0][1] == n
    ref = next(o for o in here.values() if _sig(o.raw) == common)
    for r, o in sorted(here.items()):
        if _sig(o.raw) == common and not tie:
            continue
        other = next((x for x in here.values() if _sig(x.raw) != _sig(o.raw)), ref)
        same_state = {**o.raw, "state": other.raw.get("state")}
        why = matcher(other.raw, same_state, set(key[1])) if matcher else None
        if matcher and why is None:
            continue
        text = why or f"{_sig(o.raw)} where others issued {_sig(other.raw)}"
        text += "" if not tie else " (as many ranks on each side: either may be wrong)"
        (suspects if tie else blockers).setdefault(r, []).append(
            RankEvidence(r, MISMATCH, group, opname, text)
        )
        found = True
    return found


def _judge_p2p(
    ops: dict[int, list[_Op]],
    by_rank: dict[int, FlightDump],
    descs: dict[tuple[str, tuple[int, ...]], str],
    blockers: dict[int, list[RankEvidence]],
    away: frozenset[int] = frozenset(),
) -> None:
    """A pending send/recv whose peer has no dump, or posted no matching op, is blocked by the peer."""
    for r, rops in ops.items():
        for o in rops:
            if o.kind != "p2p" or o.done or o.peer is None or o.peer in away:
                continue
            group, opname = _describe(o.key, descs), f"{o.name} with rank {o.peer}"
            if o.peer not in by_rank:
                text = f"no flight-recorder dump; rank {r} waits in {o.name} with it"
                blockers.setdefault(o.peer, []).append(RankEvidence(o.peer, NO_DUMP, group, opname, text))
                continue
            want = "recv" if o.name == "send" else "send"
            theirs = [
                p
                for p in ops[o.peer]
                if p.kind == "p2p" and p.key == o.key and p.peer == r and p.name == want
            ]
            if not any(not p.done for p in theirs) and not any(p.seq == o.seq for p in theirs):
                text = f"never posted the {want} matching rank {r}'s pending {o.name} (p2p #{o.seq})"
                blockers.setdefault(o.peer, []).append(RankEvidence(o.peer, NOT_ISSUED, group, opname, text))
