"""The agent's read-only API, its OpenAPI description and /metrics, as a client sees them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agent_service import Running, sim_config
from trainguard.agent.prometheus import DCGM_FIELDS, dcgm_pci
from trainguard.incidents import Incident, RootCause
from trainguard.incidents.goodput import Interval, IntervalKind
from trainguard.incidents.store import IncidentStore


@pytest.fixture
def agent(tmp_path: Path):
    with Running(sim_config(tmp_path)) as running:
        yield running


def test_node_and_gpus_show_a_fault_with_its_reasons(agent: Running) -> None:
    assert agent.json("/api/v1/node")["health"] == "ok"
    agent.daemon.sim.now().dbe(gpu=2)
    agent.daemon.step()
    node = agent.json("/api/v1/node")
    assert node["health"] == "failed" and node["hostname"] == "node-a"
    assert any(r.startswith("GPU 2: ") and "double-bit" in r for r in node["reasons"])
    gpus = agent.json("/api/v1/gpus")
    assert [g["index"] for g in gpus] == list(range(8))
    assert gpus[2]["health"] == "failed" and gpus[2]["reading"]["ecc_dbe_volatile"] >= 1
    assert gpus[0]["health"] == "ok" and gpus[0]["reading"]["temperature_c"] > 0
    assert agent.json("/api/v1/gpus/2")["uuid"] == gpus[2]["uuid"]
    assert agent.get("/api/v1/gpus/9")[0] == 404
    failed = agent.json("/api/v1/findings?health=failed")
    assert failed and {f["gpu"] for f in failed} == {2}
    assert agent.json("/api/v1/findings?gpu=0") == []


def test_history_returns_only_new_points(agent: Running) -> None:
    agent.daemon.step()
    h = agent.json("/api/v1/history")
    assert h["fields"][:2] == ["time", "temperature_c"] and len(h["gpus"]["0"]) == 2
    last = h["gpus"]["0"][-1][0]
    agent.daemon.step()
    assert len(agent.json(f"/api/v1/history?since={last}")["gpus"]["0"]) == 1
    assert agent.get("/api/v1/history?since=yesterday")[0] == 400


def test_incidents_filter_and_page_newest_first(agent: Running, tmp_path: Path) -> None:
    with IncidentStore(tmp_path / "tg.db") as store:
        for i in range(7):
            store.add(
                Incident(
                    job="node:node-a",
                    time=1000.0 + i,
                    root_cause=RootCause.FAULTY_GPU,
                    gpu=i % 2,
                    node="node-a",
                )
            )
        store.add(Incident(job="llm", time=2000.0, root_cause=RootCause.SOFTWARE_BUG))
    page = agent.json("/api/v1/incidents?limit=3")
    assert page["total"] == 8 and [i["time"] for i in page["items"]] == [2000.0, 1006.0, 1005.0]
    assert page["next_offset"] == 3
    last = agent.json("/api/v1/incidents?limit=3&offset=6")
    assert len(last["items"]) == 2 and last["next_offset"] is None
    gpu1 = agent.json("/api/v1/incidents?gpu=1&job=node:node-a")
    assert gpu1["total"] == 3 and {i["gpu"] for i in gpu1["items"]} == {1}
    assert agent.json("/api/v1/incidents?root_cause=software_bug")["total"] == 1
    assert agent.json("/api/v1/incidents?since=1003&until=1005")["total"] == 3
    assert agent.get("/api/v1/incidents?limit=0")[0] == 400
    assert agent.get("/api/v1/incidents?limit=100000")[0] == 400


def test_jobs_carry_their_goodput(agent: Running, tmp_path: Path) -> None:
    with IncidentStore(tmp_path / "tg.db") as store:
        store.start_job("llm", started=0.0, name="llm-7b")
        store.add_intervals(
            [Interval("llm", IntervalKind.PRODUCTIVE, 0, 90), Interval("llm", IntervalKind.RESTART, 90, 100)]
        )
        store.end_job("llm", ended=100.0, status="succeeded")
    (job,) = agent.json("/api/v1/jobs")
    assert job["name"] == "llm-7b" and job["goodput"]["ettr"] == pytest.approx(0.9)


def test_openapi_describes_every_route_the_agent_serves(agent: Running) -> None:
    spec = agent.json("/api/v1/openapi.json")
    assert spec["openapi"].startswith("3.")
    documented = set(spec["paths"])
    served = {
        "/healthz",
        "/metrics",
        *agent.service.api.routes,
        "/api/v1/incidents",
        "/api/v1/jobs",
        "/api/v1/gpus/{index}",
    }
    assert served <= documented
    for path in documented - {"/api/v1/gpus/{index}"}:
        assert agent.get(path)[0] == 200, path


# dcgm-exporter's default counter set (etc/default-counters.csv, release 4.5.x) but
# DCGM_FI_DEV_VGPU_LICENSE_STATUS (vGPU only; docs/agent.md) and DCGM_FI_DRIVER_VERSION (a label).
DCGM_DEFAULT_COUNTERS = (
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
)


def test_every_default_dcgm_exporter_counter_is_served_for_every_gpu(agent: Running) -> None:
    text = agent.get("/metrics")[2].decode()
    for name in DCGM_DEFAULT_COUNTERS:
        gpus = set(re.findall(rf'^{name}\{{.*gpu="(\d+)".*\}} \S+$', text, re.M))
        assert gpus == {str(i) for i in range(8)}, name
    # an Xid-free GPU reports 0, as dcgm-exporter does, so panels and alerts see the series
    assert len(re.findall(r"^DCGM_FI_DEV_XID_ERRORS\{.*\} 0\.0$", text, re.M)) == 8


def test_metrics_use_dcgm_exporter_names_and_labels(agent: Running) -> None:
    agent.daemon.sim.now().xid(79, gpu=3)
    agent.daemon.step()
    status, headers, body = agent.get("/metrics")
    text = body.decode()
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    gpu0 = agent.json("/api/v1/gpus/0")
    labels = (
        'DCGM_FI_DRIVER_VERSION="550.90.07",'
        f'Hostname="node-a",UUID="{gpu0["uuid"]}",device="nvidia0",gpu="0",'
        f'modelName="{gpu0["name"]}",pci_bus_id="{dcgm_pci(gpu0["pci"])}"'
    )
    for name in (
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    ):
        assert re.search(rf"^{name}\{{{re.escape(labels)}\}} \d", text, re.M), name
    assert re.search(r'^DCGM_FI_DEV_XID_ERRORS\{.*gpu="3".*\} 79\.0$', text, re.M)
    assert re.search(r'^trainguard_xid_total\{.*gpu="3".*xid="79"\} 1\.0$', text, re.M)
    assert re.search(r'^trainguard_gpu_lost\{.*gpu="3".*\} 1\.0$', text, re.M)
    assert 'trainguard_node_health{Hostname="node-a",state="failed"} 1.0' in text
    assert re.search(
        r"^trainguard_incidents_total\{action=\"reboot_node\",root_cause=\"faulty_gpu\"\} [1-9]", text, re.M
    )
    assert "trainguard_detection_latency_seconds_count" in text and "process_resident_memory_bytes" in text
    assert not re.search(r"^DCGM_FI_DEV_GPU_TEMP\{.*gpu=\"3\"", text, re.M)  # a lost GPU reads nothing
    assert dcgm_pci("0000:3b:00") == "00000000:3B:00.0"


def test_xid_counter_keeps_every_event_where_dcgm_keeps_the_last(agent: Running) -> None:
    for code in (13, 31, 13):
        agent.daemon.sim.now().xid(code, gpu=1)
        agent.daemon.step()
    text = agent.get("/metrics")[2].decode()
    assert re.search(r'^DCGM_FI_DEV_XID_ERRORS\{.*gpu="1".*\} 13\.0$', text, re.M)
    counts = dict(re.findall(r'^trainguard_xid_total\{.*gpu="1".*xid="(\d+)"\} ([\d.]+)$', text, re.M))
    pci = agent.json("/api/v1/gpus/1")["pci"]
    logged = {
        c: sum(f"Xid (PCI:{pci}): {c}," in line for line in agent.daemon.sim.kernel_log) for c in ("13", "31")
    }
    assert logged["13"] >= 2 and counts == {c: f"{n}.0" for c, n in logged.items()}


def test_every_dcgm_field_maps_to_a_sample_attribute() -> None:
    from trainguard.records import Sample

    attrs = set(Sample.__dataclass_fields__)
    assert {attr for attr, _ in DCGM_FIELDS.values()} <= attrs


def test_dashboard_assets_are_served_by_the_agent(agent: Running) -> None:
    status, headers, page = agent.get("/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    html = page.decode()
    for src in re.findall(r'(?:src|href)="(/[^"]+)"', html):
        assert agent.get(src)[0] == 200, src
    assert "http://" not in html and "https://" not in html  # no CDN
    assert "default-src 'self'" in headers["content-security-policy"]


def test_healthz_says_when_the_store_cannot_be_written(tmp_path: Path) -> None:
    (tmp_path / "blocked").write_text("a file, not a directory")
    with Running(sim_config(tmp_path, db=str(tmp_path / "blocked" / "tg.db"))) as agent:
        agent.daemon.sim.now().xid(79, gpu=3)
        agent.daemon.step()
        raw = agent.get("/healthz", token=None)[2]
        assert json.loads(raw) == {"status": "degraded"}
        assert b"blocked" not in raw and str(tmp_path).encode() not in raw  # no path for strangers
        problems = agent.json("/api/v1/node")["agent"]["problems"]  # the reason, behind the token
        assert "incident store" in problems[0] and "blocked" in problems[0]
        assert agent.get("/api/v1/incidents")[0] == 503


def test_healthz_fails_when_the_sampling_loop_stalls(agent: Running) -> None:
    agent.daemon.last_tick_monotonic -= 4 * agent.daemon.config.interval_s  # four intervals without a tick
    status, _, body = agent.get("/healthz", token=None)
    assert status == 503 and json.loads(body)["status"] == "failed"


def test_head_answers_headers_without_a_body(agent: Running) -> None:
    status, headers, body = agent.get("/metrics", method="HEAD")
    assert status == 200 and int(headers["content-length"]) > 1000 and body == b""
