"""A multi-node job's surviving node judges the peer node that died, not the network (#23).

The lines are what a real survivor wrote: `trainguard run --nnodes 1:2` on two "nodes" over
127.0.0.1, node b's supervisor and workers SIGKILLed while both trained (gloo, torch 2.13)."""

from __future__ import annotations

from trainguard.incidents import RootCause
from trainguard.records import Category, Event, EventKind, Severity
from trainguard.rundir import ErrorRecord
from trainguard.supervisor.exits import Exited, exit_trouble
from trainguard.supervisor.logs import default_classifier
from trainguard.supervisor.peers import NODE_FAILURE, peer_left, peer_node_trouble

RESET = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
    "[127.0.0.1]:33693: Connection reset by peer. This is typically caused by a remote worker hanging or "
    "bugs in the application. Check the logs of the remote worker before reporting an error. GLHF!"
)
ME, PEER = "vm_17517_0", "vm_17518_0"


def survivor_trouble(message: str = RESET, exc_type: str = "RuntimeError"):
    err = ErrorRecord(rank=0, time=100.0, exc_type=exc_type, message=message)
    trouble = exit_trouble(
        101.0, [Exited(0, 0, 1, 100.5)], [err], [], [], {0: 0}, {0: None}, default_classifier()
    )
    return trouble, [err]


def test_a_survivors_connection_reset_is_the_peer_node_or_unknown_never_the_network():
    trouble, errors = survivor_trouble()
    assert trouble.root_cause in (RootCause.NETWORK_SWITCH_CABLE, RootCause.NCCL_WATCHDOG_TIMEOUT)  # before
    judged = peer_node_trouble(trouble, ME, [0], {PEER: (1,)}, errors, [])
    assert judged is not None
    assert judged.root_cause is RootCause.UNKNOWN and judged.category == "unknown"
    assert judged.ranks == (1,) and judged.rank is None and judged.gpu is None  # not this node's rank 0
    line = judged.evidence[0]
    assert line.startswith("unknown; suspects: host") and PEER in line and "network_switch_cable" in line
    assert judged.extra["suspect_nodes"] == [PEER]


def test_the_next_rendezvous_without_the_node_makes_it_a_node_failure():
    changes = peer_left([PEER], (1,), {})
    assert changes is not None
    assert changes["root_cause"] is RootCause.HOST and changes["category"] == NODE_FAILURE
    assert changes["node"] == PEER and changes["rank"] == 1
    assert peer_left([PEER], (1,), {PEER: (1,)}) is None  # it re-joined: the rendezvous does not decide


def test_elastics_dead_node_line_names_the_node_and_its_ranks():
    trouble, errors = survivor_trouble()
    dead = Event(
        EventKind.TRAINING,
        f"[WARNING] Detected dead node '{PEER}', removing it from the rendezvous",
        time=99.0,
        category=Category.NODE_HOST,
        severity=Severity.WARNING,
    )
    judged = peer_node_trouble(trouble, ME, [0, 1], {PEER: (2, 3), "vm_17519_0": (4, 5)}, errors, [dead])
    assert judged is not None and judged.root_cause is RootCause.HOST and judged.category == NODE_FAILURE
    assert judged.extra["node"] == PEER and judged.ranks == (2, 3) and judged.rank == 2


def test_a_peer_address_that_maps_to_a_node_names_it():
    trouble, errors = survivor_trouble("Connection closed by peer [nodeb]:29500")
    judged = peer_node_trouble(trouble, "nodea_1_0", [0], {"nodeb_7_0": (1,)}, errors, [])
    assert judged is not None and judged.category == NODE_FAILURE and judged.extra["node"] == "nodeb_7_0"


def test_a_local_cause_stays_this_nodes():
    trouble, errors = survivor_trouble("shape mismatch: [4, 8] vs [8, 4]", "ValueError")
    assert peer_node_trouble(trouble, ME, [0], {PEER: (1,)}, errors, []) is None
    trouble, errors = survivor_trouble()
    assert peer_node_trouble(trouble, ME, [0], {}, errors, []) is None  # one node: no peer to blame


def test_with_two_peer_nodes_both_are_suspects_until_the_rendezvous_shows_which_left():
    trouble, errors = survivor_trouble()
    other = "vm_17519_0"
    judged = peer_node_trouble(trouble, ME, [0], {PEER: (1,), other: (2,)}, errors, [])
    assert judged is not None and judged.root_cause is RootCause.UNKNOWN
    assert judged.extra["suspect_nodes"] == [PEER, other] and judged.ranks == (1, 2)
    changes = peer_left([PEER, other], judged.ranks, {other: (1,)})
    assert changes is not None and changes["node"] == PEER and changes["rank"] is None  # ranks re-numbered
    assert peer_left([PEER, other], judged.ranks, {}) is None  # both gone: the rendezvous does not say which


def test_a_plain_scripts_survivor_is_judged_from_what_torch_left_not_only_the_guards_file():
    # no Guard error file: the rank's exception comes from torchelastic's error file or its stderr
    trouble, _ = survivor_trouble()
    assert peer_node_trouble(trouble, ME, [0], {PEER: (1,)}, [], []) is None  # nothing to read
    judged = peer_node_trouble(trouble, ME, [0], {PEER: (1,)}, [], [], {0: f"RuntimeError: {RESET}"})
    assert judged is not None and judged.root_cause is RootCause.UNKNOWN
    assert judged.extra["suspect_nodes"] == [PEER] and judged.rank is None
    own = {0: "ValueError: shape mismatch: [4, 8] vs [8, 4]"}  # the script's own failure stays here
    assert peer_node_trouble(trouble, ME, [0], {PEER: (1,)}, [], [], own) is None


def test_a_lost_connection_with_no_peer_to_name_carries_its_suspects_in_the_incident():
    # one node (no rendezvous peers), a plain script: only the classified stderr line is evidence
    line = default_classifier()(f"[rank0]: RuntimeError: {RESET}")
    assert line is not None
    trouble = exit_trouble(
        101.0, [Exited(0, 0, 1, 100.5)], [], [line], [], {0: 0}, {0: None}, default_classifier()
    )
    assert trouble.root_cause is RootCause.UNKNOWN
    assert trouble.evidence[0].startswith("unknown; suspects: host (the peer's node")
    assert "network_switch_cable" in trouble.evidence[0]
