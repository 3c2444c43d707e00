"""The node agent's loop survives what a node throws at it and resumes without repeating itself."""

from __future__ import annotations

import errno
import os
import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from agent_service import sim_config
from trainguard.actions import Advice
from trainguard.agent import AgentDaemon
from trainguard.agent import daemon as daemon_module
from trainguard.agent.judge import incidents_for, onsets
from trainguard.agent.snapshot import History
from trainguard.agent.state import Cursor, SavedState, load_state, save_state
from trainguard.incidents.store import IncidentStore
from trainguard.records import Finding, Gpu, Health, Sample
from trainguard.telemetry.sim import pci_address, write_xid_line


def kernel_incidents(db: Path) -> list[str]:
    with IncidentStore(db) as store:
        return [i.summary for i in store.incidents() if i.evidence and i.evidence[0] == "xid"]


def test_a_finding_is_counted_when_it_appears_not_while_it_lasts() -> None:
    f = Finding("thermal", Health.DEGRADED, Advice.RUN_DIAGNOSTICS, "hot", gpu=1)
    new, active = onsets(Counter(), [f])
    assert new == [f]
    assert onsets(active, [f])[0] == []
    assert onsets(active, [f, f])[0] == [f]  # a second one of the same kind is new
    assert onsets(onsets(active, [])[1], [f])[0] == [f]  # gone, then back: new again


def test_two_witnesses_of_one_gpu_fault_in_a_tick_make_one_incident() -> None:
    lost = Finding("telemetry", Health.FAILED, Advice.REBOOT_NODE, "GPU stopped answering", gpu=3, time=100.0)
    xid = Finding(
        "xid", Health.FAILED, Advice.RESET_GPU, "Xid 79: GPU has fallen off the bus", gpu=3, time=99.5
    )
    other = Finding("thermal", Health.DEGRADED, Advice.RUN_DIAGNOSTICS, "hot", gpu=5, time=100.0)
    fine = Finding("ecc", Health.OK, Advice.NONE, "no errors", gpu=1)
    incidents = incidents_for([xid, lost, other, fine], "node-a", now=101.0)
    assert [(i.gpu, i.action) for i in incidents] == [(3, "reboot_node"), (5, "run_diagnostics")]
    gpu3 = incidents[0]
    assert gpu3.summary == "GPU stopped answering"  # the strongest witness leads
    assert any("Xid 79" in e for e in gpu3.evidence)  # the other witness is kept as evidence
    assert gpu3.started == 99.5 and gpu3.detection_delay_s == 1.5  # from the earliest witness


def test_a_fault_becomes_one_incident_however_many_ticks_it_lasts(tmp_path: Path) -> None:
    daemon = AgentDaemon(sim_config(tmp_path))
    try:
        daemon.step()
        daemon.sim.now().dbe(gpu=2)
        for _ in range(5):
            snap = daemon.step()
        assert snap.verdict is not None and snap.verdict.health is Health.FAILED
        with IncidentStore(tmp_path / "tg.db") as store:
            incidents = store.incidents()
        rules = Counter(i.evidence[0] for i in incidents)
        assert rules and max(rules.values()) == 1
        assert all(i.gpu == 2 and i.node == "node-a" and i.job == "node:node-a" for i in incidents)
        assert {i.root_cause.value for i in incidents} >= {"gpu_hbm_memory"}
        tally = daemon.tally.copy()
        assert sum(tally.incidents.values()) == len(incidents)
    finally:
        daemon.close()


class Quiet:
    """Eight healthy GPUs at the simulator's PCI addresses; the kernel log is written by the test."""

    def gpus(self) -> list[Gpu]:
        return [Gpu(i, pci=pci_address(i)) for i in range(8)]

    def sample(self) -> list[Sample]:
        return [Sample(g, 0.0, temperature_c=50.0) for g in self.gpus()]

    def close(self) -> None:
        pass


def test_restart_neither_repeats_old_kernel_log_incidents_nor_loses_new_ones(tmp_path: Path) -> None:
    kmsg = tmp_path / "kern.log"
    config = sim_config(tmp_path, kernel_log=str(kmsg))
    write_xid_line(kmsg, pci_address(3), 79, uptime=100.0)
    first = AgentDaemon(config, backend=Quiet())
    first.step()
    first.step()
    first.close()
    before = kernel_incidents(tmp_path / "tg.db")
    assert len(before) == 1 and "Xid 79" in before[0]
    write_xid_line(kmsg, pci_address(5), 48, uptime=200.0)  # logged while the agent was down
    second = AgentDaemon(config, backend=Quiet())
    try:
        second.step()
        second.step()
    finally:
        second.close()
    after = kernel_incidents(tmp_path / "tg.db")
    assert after[: len(before)] == before
    assert len(after) == 2 and "Xid 48" in after[1]


def test_a_truncated_kernel_log_is_read_from_its_start_after_a_restart(tmp_path: Path) -> None:
    kmsg = tmp_path / "kern.log"
    config = sim_config(tmp_path, kernel_log=str(kmsg))
    write_xid_line(kmsg, pci_address(3), 79, uptime=100.0)
    first = AgentDaemon(config, backend=Quiet())
    first.step()
    first.close()
    kmsg.write_text("")  # logrotate's copytruncate while the agent was down
    write_xid_line(kmsg, pci_address(1), 48, uptime=5.0)
    second = AgentDaemon(config, backend=Quiet())
    try:
        second.step()
    finally:
        second.close()
    assert [s[:6] for s in kernel_incidents(tmp_path / "tg.db")] == ["Xid 79", "Xid 48"]


def test_a_condition_that_still_holds_after_a_restart_is_not_reported_again(tmp_path: Path) -> None:
    class Hot:
        def gpus(self) -> list[Gpu]:
            return [Gpu(0)]

        def sample(self) -> list[Sample]:
            return [Sample(Gpu(0), 0.0, temperature_c=95.0, temp_slowdown_c=89.0, temp_shutdown_c=92.0)]

        def close(self) -> None:
            pass

    config = sim_config(tmp_path)
    for _ in range(2):
        daemon = AgentDaemon(config, backend=Hot())
        daemon.step()
        daemon.step()
        daemon.close()
    with IncidentStore(tmp_path / "tg.db") as store:
        assert len(store.incidents()) == 1


def test_a_locked_store_keeps_incidents_until_it_can_write(tmp_path: Path) -> None:
    daemon = AgentDaemon(sim_config(tmp_path))
    try:
        daemon.step()
        blocker = sqlite3.connect(tmp_path / "tg.db", isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")  # another writer holds the store
        daemon.sim.now().xid(79, gpu=3)
        snap = daemon.step()
        assert snap.health is Health.DEGRADED and "incident store" in snap.problems[0]
        assert snap.verdict is not None and snap.verdict.health is Health.FAILED  # still judging
        blocker.execute("ROLLBACK")
        blocker.close()
        snap = daemon.step()
        assert snap.health is Health.OK
        with IncidentStore(tmp_path / "tg.db") as store:
            assert {i.gpu for i in store.incidents()} == {3}
        assert daemon.tally.copy().errors["store"] == 1
    finally:
        daemon.close()


def test_a_full_disk_makes_the_agent_degraded_and_it_keeps_sampling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_space(path: Path, state: SavedState) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(daemon_module, "save_state", no_space)
    daemon = AgentDaemon(sim_config(tmp_path))
    try:
        daemon.step()
        daemon.sim.now().thermal_runaway(gpu=1, rate_c_per_s=50.0)
        snaps = [daemon.step() for _ in range(3)]
        assert all(s.health is Health.DEGRADED for s in snaps)
        assert "No space left on device" in snaps[-1].problems[0]
        assert [s.seq for s in snaps] == [2, 3, 4]
    finally:
        daemon.close()


def test_pending_incidents_are_bounded_and_drops_are_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(daemon_module, "MAX_PENDING", 1)
    daemon = AgentDaemon(sim_config(tmp_path, db=str(tmp_path / "no" / "such" / "dir" / "x.db")))
    (tmp_path / "no").write_text("a file where the store's directory should be")
    try:
        daemon.step()
        daemon.sim.now().xid(79, gpu=3)
        daemon.sim.now().xid(79, gpu=4)  # two GPUs: two incidents for a queue that holds one
        snap = daemon.step()
        assert snap.health is Health.DEGRADED
        assert daemon.pending == 1 and daemon.tally.copy().incidents_dropped >= 1
    finally:
        daemon.close()


def test_a_gpu_off_the_bus_and_a_failing_driver_do_not_stop_the_loop(tmp_path: Path) -> None:
    daemon = AgentDaemon(sim_config(tmp_path))
    try:
        daemon.step()
        daemon.sim.now().xid(79, gpu=4)
        snap = daemon.step()
        assert [s.lost for s in snap.samples].count(True) == 1

        def broken() -> list[Sample]:
            raise RuntimeError("NVML_ERROR_UNKNOWN")

        daemon.sim.sample = broken
        snap = daemon.step()
        assert snap.samples == () and snap.health is Health.DEGRADED
        assert snap.verdict is not None and snap.verdict.health is Health.FAILED  # GPU 4's Xid still counts
        assert daemon.tally.copy().errors["telemetry"] == 1
    finally:
        daemon.close()


def test_reload_applies_what_it_can_and_names_what_needs_a_restart(tmp_path: Path) -> None:
    config = sim_config(tmp_path)
    daemon = AgentDaemon(config)
    try:
        import dataclasses

        from trainguard.detect.thresholds import Thresholds

        changed = dataclasses.replace(config, interval_s=5.0, listen="127.0.0.1:1")
        assert daemon.reload(changed, Thresholds()) == ["listen"]
        assert daemon.config.interval_s == 5.0 and daemon.wake.is_set()
    finally:
        daemon.close()


def test_history_keeps_only_its_window(tmp_path: Path) -> None:
    history = History(window_s=10.0, interval_s=1.0)
    for t in range(100):
        history.add((Sample(Gpu(0), float(t), temperature_c=50.0),))
    points = history.since(0.0)[0]
    assert len(points) == 12 and points[-1][0] == 99.0
    assert [p[0] for p in history.since(97.0)[0]] == [98.0, 99.0]


def test_state_round_trips_and_a_corrupt_file_starts_afresh(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    state = SavedState(
        Cursor(1, 2, 300, "ab"), Counter({("xid", 3, "failed", "reboot_node", "gpu_hardware"): 1})
    )
    save_state(path, state)
    assert load_state(path) == state
    path.write_text("{not json")
    assert load_state(path) == SavedState()


def test_kmsg_resumes_after_the_last_sequence_number_of_the_same_boot(tmp_path: Path) -> None:
    from trainguard.telemetry.resume import ResumingKmsg

    records = [
        b"6,10,100,-;NVRM: loading\n",
        b"4,11,200,-;NVRM: Xid (PCI:0000:1b:00): 79, GPU has fallen off the bus.\n",
    ]

    def reader() -> object:
        queue = list(records)

        def read(fd: int, n: int) -> bytes:
            if not queue:
                raise BlockingIOError
            return queue.pop(0)

        return read

    stand_in = tmp_path / "kmsg"
    stand_in.write_text("")
    first = ResumingKmsg(stand_in, boot_id="boot-1", read=reader())
    assert len(first.poll()) == 2
    cursor = first.cursor
    first.close()
    records.append(b"4,12,300,-;NVRM: Xid (PCI:0000:1b:00): 48, DBE\n")
    again = ResumingKmsg(stand_in, cursor, boot_id="boot-1", read=reader())
    assert [line.split(";")[0] for line in again.poll()] == ["4,12,300,-"]
    again.close()
    rebooted = ResumingKmsg(stand_in, cursor, boot_id="boot-2", read=reader())
    assert len(rebooted.poll()) == 3  # a new boot: every record is new
    rebooted.close()


@pytest.mark.parametrize(
    "name",
    [
        "trainguard.agent.judge",
        "trainguard.agent.daemon",
        "trainguard.agent.prometheus",
        "trainguard.agent.node",
        "trainguard.agent.tick",
        "trainguard.agent.verdicts",
        "trainguard.agent.assemble",
        "trainguard.agent.fairqueue",
        "trainguard.remediate.breaker_view",
        "trainguard.detect.detector",
        "trainguard.detect.gpu_index",
        "trainguard.telemetry.series",
        "trainguard.tokens",
        "trainguard.telemetry.lines",
    ],
)
def test_module_examples_run(name: str) -> None:
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0


def test_reloaded_thresholds_judge_the_next_tick(tmp_path: Path) -> None:
    from trainguard.detect.thresholds import Thresholds

    class Warm(Quiet):
        def sample(self) -> list[Sample]:
            return [Sample(Gpu(0), 0.0, temperature_c=82.0, temp_slowdown_c=89.0, temp_shutdown_c=92.0)]

    config = sim_config(tmp_path)
    daemon = AgentDaemon(config, backend=Warm())
    try:
        assert daemon.step().verdict.health is Health.OK  # type: ignore[union-attr]
        daemon.reload(config, Thresholds(thermal_margin_c=10.0))
        assert daemon.step().verdict.health is Health.DEGRADED  # type: ignore[union-attr]
    finally:
        daemon.close()


def test_the_act_step_gets_each_judged_tick_after_its_incidents_are_stored(tmp_path: Path) -> None:
    from trainguard.agent import Judged

    seen: list[tuple[Judged, int, list[int | None]]] = []
    daemon: AgentDaemon | None = None

    def act(judged: Judged) -> None:
        assert daemon is not None  # what record left behind, as the act sees it
        stored = [i.gpu for i in daemon.store().incidents()]
        seen.append((judged, daemon.tally.copy().ticks, stored))

    daemon = AgentDaemon(sim_config(tmp_path), act=act)
    try:
        daemon.step()
        assert daemon.sim is not None
        daemon.sim.now().xid(79, gpu=3)
        daemon.step()
    finally:
        daemon.close()
    (first, ticks0, stored0), (second, ticks1, stored1) = seen
    assert first.new == () and first.incidents == () and ticks0 == 1 and stored0 == []
    assert second.verdict.health.value == "failed" and ticks1 == 2
    assert [i.gpu for i in second.incidents] == [3] and second.hostname == "node-a"
    assert stored1 == [3]  # the incident the act acts on is already in the store


def test_an_act_with_a_close_is_closed_with_the_daemon(tmp_path: Path) -> None:
    class Worker:
        def __init__(self) -> None:
            self.calls, self.closed = 0, False

        def __call__(self, judged: object) -> None:
            self.calls += 1

        def close(self) -> None:
            self.closed = True

    worker = Worker()
    daemon = AgentDaemon(sim_config(tmp_path), act=worker)
    daemon.step()
    daemon.close()
    assert worker.calls == 1 and worker.closed


def test_an_act_that_raises_is_counted_and_the_tick_is_still_recorded(tmp_path: Path) -> None:
    def broken(judged: object) -> None:
        raise RuntimeError("remediation backend down")

    daemon = AgentDaemon(sim_config(tmp_path), act=broken)
    try:
        assert daemon.sim is not None
        daemon.sim.now().xid(79, gpu=3)
        snap = daemon.step()
        assert snap.seq == 1 and daemon.tally.copy().errors["act"] == 1
        assert len(daemon.store().incidents()) == 1
    finally:
        daemon.close()
