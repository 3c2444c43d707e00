"""A survivor takes the node it lost out of torch's c10d rendezvous, and the next round admits the
spare at once instead of after the lost node's keep-alive expires (#35).

Three real `DynamicRendezvousHandler`s on one TCPStore act as nodes a, b and a spare c. b stops
its heartbeats (it died); its keep-alive window (60 s) is longer than a's join timeout (20 s), so
without `drop_from_rendezvous` a's next round times out waiting for b's place to free up."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")

from torch.distributed import TCPStore  # noqa: E402
from torch.distributed.elastic.rendezvous import RendezvousTimeoutError  # noqa: E402
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend  # noqa: E402
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (  # noqa: E402
    DynamicRendezvousHandler,
    RendezvousTimeout,
)

from trainguard.supervisor.elastic import drop_from_rendezvous  # noqa: E402

_MASTERS: list[TCPStore] = []  # the rendezvous stores' server, alive for the module


def handlers(n: int) -> list[DynamicRendezvousHandler]:
    """``n`` nodes' handlers, each on its own connection to one store (as on separate hosts)."""
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    _MASTERS.append(master)
    timeout = RendezvousTimeout(join=timedelta(seconds=20), last_call=timedelta(seconds=1))
    out = []
    for _ in range(n):
        store = TCPStore("127.0.0.1", master.port, is_master=False)
        backend = C10dRendezvousBackend(store, "job")
        out.append(
            DynamicRendezvousHandler.from_backend("job", store, backend, 2, 2, "127.0.0.1", timeout, 1, 60)
        )
    return out


def join(hs: list[DynamicRendezvousHandler]) -> dict[str, object]:
    out: dict[str, object] = {}

    def one(h: DynamicRendezvousHandler) -> None:
        try:
            out[str(h._this_node)] = h.next_rendezvous().world_size
        except Exception as exc:
            out[str(h._this_node)] = exc

    threads = [threading.Thread(target=one, args=(h,)) for h in hs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


@pytest.fixture(autouse=True)
def _own_store(monkeypatch):
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")  # as trainguard run's workers


def test_the_lost_node_taken_out_lets_the_spare_in_without_waiting_for_its_keep_alive():
    a, b, c = handlers(3)
    try:
        assert join([a, b]) == {str(a._this_node): 2, str(b._this_node): 2}
        b._stop_heartbeats()  # b dies
        results: dict[str, object] = {}
        spare = threading.Thread(target=lambda: results.update(join([c])))
        spare.start()  # the round is full: c waits in its redundancy list
        lost = str(b._this_node)
        assert drop_from_rendezvous(a, [lost, "elsewhere_1_0"]) == [lost]
        assert join([a]) == {str(a._this_node): 2}  # the next round: a and the spare
        spare.join(60)
        assert results == {str(c._this_node): 2}
        assert drop_from_rendezvous(a, [lost]) == []  # already out
    finally:
        for h in (a, b, c):
            h._stop_heartbeats()


@pytest.mark.slow  # the 20 s join timeout
def test_without_it_the_next_round_waits_for_the_lost_nodes_keep_alive():
    a, b = handlers(2)
    try:
        join([a, b])
        b._stop_heartbeats()
        [outcome] = join([a]).values()
        assert isinstance(outcome, RendezvousTimeoutError)  # the 20 s join timeout came first
    finally:
        for h in (a, b):
            h._stop_heartbeats()


def test_a_rendezvous_without_that_state_is_left_to_its_keep_alive():
    assert drop_from_rendezvous(object(), ["n_1_0"]) == []
