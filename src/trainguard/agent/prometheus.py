"""The node agent's ``/metrics``: dcgm-exporter's names where the quantity is one it exports,
``trainguard_*`` for the rest. The only importer of prometheus_client.

    >>> from trainguard.agent import AgentConfig, AgentDaemon
    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> daemon = AgentDaemon(AgentConfig(backend="sim", gpus=2, db=f"{d}/tg.db", state_dir=d))
    >>> _ = daemon.step()
    >>> b'DCGM_FI_DEV_GPU_TEMP{DCGM_FI_DRIVER_VERSION="550.90.07",Hostname=' in MetricsView(daemon).render()
    True
    >>> daemon.close()

Every field of dcgm-exporter's default counter set (etc/default-counters.csv) that NVML can give
is here, under its name, with the labels its current release (4.5.x) puts on them: ``gpu``,
``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``Hostname`` and the driver version as the
``DCGM_FI_DRIVER_VERSION`` label; so its Grafana dashboards and alerts work unchanged. Its
counters (energy, ECC, PCIe replay, row remaps, NVLink bandwidth) are typed ``gauge`` here:
prometheus_client would append ``_total`` to a counter's name and break those dashboards;
``rate()`` works on them either way. ``DCGM_FI_DEV_XID_ERRORS`` is 0 for every GPU until its
first Xid, as dcgm-exporter reports it; ``trainguard_xid_total`` counts every Xid by code.

The text is rendered once per tick (the readings do not change in between) and then served from
that cache, so a scrape costs a dictionary lookup.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

try:
    from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
    from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
except ImportError:
    raise ImportError(
        "trainguard's /metrics needs prometheus_client: pip install 'trainguard[agent]'"
    ) from None

from trainguard import __version__
from trainguard.agent.snapshot import LATENCY_BUCKETS, REFUSALS
from trainguard.records import Health, Sample

if TYPE_CHECKING:
    from trainguard.agent.daemon import AgentDaemon

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION")
HEALTH_STATES = tuple(h.value for h in Health)

# dcgm-exporter field -> (Sample attribute, help); value None (unreadable) leaves the series out.
DCGM_FIELDS: dict[str, tuple[str, str]] = {
    "DCGM_FI_DEV_GPU_TEMP": ("temperature_c", "GPU temperature (in C)."),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", "Power draw (in W)."),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("power_limit_w", "Power management limit (in W)."),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", "SM clock frequency (in MHz)."),
    "DCGM_FI_DEV_MEM_CLOCK": ("mem_clock_mhz", "Memory clock frequency (in MHz)."),
    "DCGM_FI_DEV_GPU_UTIL": ("util_gpu_pct", "GPU utilization (in %)."),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("util_mem_pct", "Memory utilization (in %)."),
    "DCGM_FI_DEV_FB_USED": ("mem_used_mib", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_FAN_SPEED": ("fan_pct", "Fan speed (in %)."),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("ecc_sbe_volatile", "Total number of single-bit volatile ECC errors."),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("ecc_dbe_volatile", "Total number of double-bit volatile ECC errors."),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": (
        "ecc_sbe_aggregate",
        "Total number of single-bit persistent ECC errors.",
    ),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": (
        "ecc_dbe_aggregate",
        "Total number of double-bit persistent ECC errors.",
    ),
    "DCGM_FI_DEV_RETIRED_SBE": ("retired_sbe", "Total number of retired pages due to single-bit errors."),
    "DCGM_FI_DEV_RETIRED_DBE": ("retired_dbe", "Total number of retired pages due to double-bit errors."),
    "DCGM_FI_DEV_RETIRED_PENDING": ("retired_pending", "Total number of pages pending retirement."),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": (
        "remap_correctable",
        "Number of remapped rows for correctable errors.",
    ),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": (
        "remap_uncorrectable",
        "Number of remapped rows for uncorrectable errors.",
    ),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("remap_failure", "Whether remapping of rows has failed."),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("remap_pending", "Whether a row remap waits for a GPU reset."),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("pcie_replay", "Total number of PCIe retries."),
    "DCGM_FI_DEV_PCIE_LINK_GEN": ("pcie_gen", "PCIe link generation."),
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": ("pcie_width", "PCIe link width."),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": (
        "nvlink_replay_errors",
        "Total number of NVLink retries.",
    ),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": (
        "nvlink_recovery_errors",
        "Total number of NVLink recovery errors.",
    ),
    "DCGM_FI_DEV_FB_FREE": ("mem_free_mib", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_RESERVED": ("mem_reserved_mib", "Framebuffer memory reserved (in MiB)."),
    "DCGM_FI_DEV_MEMORY_TEMP": ("memory_temp_c", "Memory temperature (in C)."),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy_mj", "Total energy consumption since boot (in mJ)."),
    "DCGM_FI_DEV_ENC_UTIL": ("enc_util_pct", "Encoder utilization (in %)."),
    "DCGM_FI_DEV_DEC_UTIL": ("dec_util_pct", "Decoder utilization (in %)."),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": (
        "nvlink_data_kib",
        "Total number of NVLink bandwidth counters for all lanes (NVML data throughput, tx + rx, in KiB).",
    ),
    # NVML GPM: Hopper and newer (docs/agent.md)
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gr_engine_active", "Ratio of time the graphics engine is active."),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("tensor_active", "Ratio of cycles the tensor (HMMA) pipe is active."),
    "DCGM_FI_PROF_DRAM_ACTIVE": (
        "dram_active",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
    "DCGM_FI_PROF_PCIE_TX_BYTES": (
        "pcie_tx_bytes_s",
        "The rate of data transmitted over the PCIe bus (in B/s).",
    ),
    "DCGM_FI_PROF_PCIE_RX_BYTES": (
        "pcie_rx_bytes_s",
        "The rate of data received over the PCIe bus (in B/s).",
    ),
}
# trainguard's own per-GPU readings that dcgm-exporter has no single field for.
OWN_GPU_FIELDS: dict[str, tuple[str, str]] = {
    "trainguard_gpu_nvlink_crc_errors": ("nvlink_crc_errors", "NVLink CRC errors (flit + data), all links."),
    "trainguard_gpu_nvlink_links_up": ("nvlink_up", "NVLink links active."),
    "trainguard_gpu_sm_clock_max_mhz": ("sm_clock_max_mhz", "Maximum SM clock (in MHz)."),
    "trainguard_gpu_temp_slowdown_c": ("temp_slowdown_c", "Temperature of the hardware slowdown (in C)."),
}


def dcgm_pci(pci: str | None) -> str:
    """``0000:3b:00`` -> ``00000000:3B:00.0``, the form dcgm-exporter's pci_bus_id label has."""
    if not pci:
        return ""
    domain, _, rest = pci.partition(":")
    return f"{int(domain, 16):08X}:{rest.upper()}.0"


def gpu_labels(s: Sample, hostname: str, driver: str = "") -> list[str]:
    g = s.gpu
    return [str(g.index), g.uuid or "", dcgm_pci(g.pci), f"nvidia{g.index}", g.name or "", hostname, driver]


class _Collector:
    def __init__(self, daemon: AgentDaemon) -> None:
        self.daemon = daemon

    def collect(self) -> Iterator[Metric]:
        d = self.daemon
        snap, tally = d.snapshot, d.tally.copy()
        host = snap.hostname
        labels = {s.gpu.index: gpu_labels(s, host, d.driver_version) for s in snap.samples}
        for name, (attr, doc) in (DCGM_FIELDS | OWN_GPU_FIELDS).items():
            m = GaugeMetricFamily(name, doc, labels=GPU_LABELS)
            for s in snap.samples:
                value = getattr(s, attr)
                if value is not None:
                    m.add_metric(labels[s.gpu.index], float(value))
            yield m
        xid = GaugeMetricFamily(
            "DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", labels=GPU_LABELS
        )
        for gpu in sorted(labels):  # 0 until the GPU's first Xid
            xid.add_metric(labels[gpu], tally.last_xid.get(gpu, 0))
        yield xid
        xids = _counter(
            "trainguard_xid", "Xid errors by GPU and code (every one, not the last).", [*GPU_LABELS, "xid"]
        )
        for (gpu, code), n in sorted(tally.xids.items()):
            if gpu in labels:
                xids.add_sample(
                    "trainguard_xid_total",
                    dict(zip([*GPU_LABELS, "xid"], [*labels[gpu], str(code)], strict=True)),
                    n,
                )
        yield xids
        lost = GaugeMetricFamily(
            "trainguard_gpu_lost", "1 when the GPU stopped answering (off the bus).", labels=GPU_LABELS
        )
        for s in snap.samples:
            lost.add_metric(labels[s.gpu.index], float(s.lost))
        yield lost
        yield from self._verdicts(snap, labels)
        yield from self._agent(snap, tally)
        yield from _remediation(self.daemon)

    def _verdicts(self, snap: Any, labels: dict[int, list[str]]) -> Iterator[Metric]:
        gpu_health = GaugeMetricFamily(
            "trainguard_gpu_health",
            "1 for the GPU's verdict state (ok, unknown, degraded, failed).",
            labels=[*GPU_LABELS, "state"],
        )
        node_health = GaugeMetricFamily(
            "trainguard_node_health", "1 for the node's verdict state.", labels=["Hostname", "state"]
        )
        action = GaugeMetricFamily(
            "trainguard_node_action",
            "1 for the action the node's verdict calls for.",
            labels=["Hostname", "action"],
        )
        v = snap.verdict
        if v is not None:
            for gv in v.gpus:
                if gv.gpu.index in labels:
                    for state in HEALTH_STATES:
                        gpu_health.add_metric([*labels[gv.gpu.index], state], float(gv.health.value == state))
            for state in HEALTH_STATES:
                node_health.add_metric([snap.hostname, state], float(v.health.value == state))
            action.add_metric([snap.hostname, v.action.value], 1.0)
        yield gpu_health
        yield node_health
        yield action

    def _agent(self, snap: Any, tally: Any) -> Iterator[Metric]:
        findings = _counter(
            "trainguard_findings",
            "Findings by category, action and health, counted when they appear.",
            ["category", "action", "health"],
        )
        for (cat, act, health), n in sorted(tally.findings.items()):
            findings.add_sample(
                "trainguard_findings_total", {"category": cat, "action": act, "health": health}, n
            )
        yield findings
        incidents = _counter(
            "trainguard_incidents",
            "Node incidents recorded, by root cause and action.",
            ["root_cause", "action"],
        )
        for (cause, act), n in sorted(tally.incidents.items()):
            incidents.add_sample("trainguard_incidents_total", {"root_cause": cause, "action": act}, n)
        yield incidents
        events = _counter(
            "trainguard_kernel_events", "Kernel-log events read, by kind and category.", ["kind", "category"]
        )
        for (kind, cat), n in sorted(tally.kernel_events.items()):
            events.add_sample("trainguard_kernel_events_total", {"kind": kind, "category": cat}, n)
        yield events
        errors = _counter(
            "trainguard_agent_errors",
            "Agent errors by source (telemetry, kernel_log, detector, store, series, state, act, tick).",
            ["source"],
        )
        for source in ("telemetry", "kernel_log", "detector", "store", "series", "state", "act", "tick"):
            errors.add_sample("trainguard_agent_errors_total", {"source": source}, tally.errors[source])
        yield errors
        refusals = _counter("trainguard_http_refusals", "HTTP requests refused, by reason.", ["reason"])
        for reason, n in sorted({**dict.fromkeys(REFUSALS, 0), **tally.refusals}.items()):
            refusals.add_sample("trainguard_http_refusals_total", {"reason": reason}, n)
        yield refusals
        ticks = _counter("trainguard_agent_ticks", "Samples taken (one tick of the agent loop).", [])
        ticks.add_sample("trainguard_agent_ticks_total", {}, tally.ticks)
        yield ticks
        dropped = _counter(
            "trainguard_agent_incidents_dropped", "Incidents dropped because the store stayed unwritable.", []
        )
        dropped.add_sample("trainguard_agent_incidents_dropped_total", {}, tally.incidents_dropped)
        yield dropped
        lat = HistogramMetricFamily(
            "trainguard_detection_latency_seconds",
            "From the evidence (reading or tick start) to the published finding.",
        )
        cumulative = [(str(b), float(tally.latency_buckets[b])) for b in LATENCY_BUCKETS]
        lat.add_metric([], [*cumulative, ("+Inf", float(tally.latency_count))], tally.latency_sum)
        yield lat
        health = GaugeMetricFamily(
            "trainguard_agent_health", "1 for the agent's own health state.", labels=["state"]
        )
        for state in HEALTH_STATES:
            health.add_metric([state], float(snap.health.value == state))
        yield health
        yield GaugeMetricFamily(
            "trainguard_agent_tick_seconds",
            "Duration of the last tick (sample, rules, store).",
            value=snap.tick_s,
        )
        yield GaugeMetricFamily(
            "trainguard_agent_interval_seconds", "Configured sampling interval.", value=snap.interval_s
        )
        lag = max(0.0, time.monotonic() - self.daemon.last_tick_monotonic)
        yield GaugeMetricFamily(
            "trainguard_agent_lag_seconds", "Seconds since the last tick ended.", value=lag
        )
        pending = self.daemon.pending
        yield GaugeMetricFamily(
            "trainguard_agent_incidents_pending", "Incidents waiting for the store.", value=pending
        )
        yield GaugeMetricFamily(
            "trainguard_store_spool_depth",
            "Writes waiting in the local spool for a fleet database that is away.",
            value=self.daemon.spool_depth,
        )
        info = GaugeMetricFamily(
            "trainguard_agent_info", "The agent's version.", labels=["version", "Hostname"]
        )
        info.add_metric([__version__, snap.hostname], 1.0)
        yield info


def _remediation(daemon: AgentDaemon) -> Iterator[Metric]:
    """The breaker and the remediation counts (trainguard.remediate.hook says what they are);
    none when the daemon runs no remediation."""
    from trainguard.agent.assemble import remediation_of

    remediation = remediation_of(daemon)
    if remediation is None:
        return
    for name, kind, doc, samples in remediation.metrics():
        m = Metric(name, doc, kind)
        for labels, value in samples:
            m.add_sample(name + ("_total" if kind == "counter" else ""), labels, value)
        yield m


def _counter(name: str, doc: str, labels: list[str]) -> Metric:
    del labels  # the samples carry them
    return Metric(name, doc, "counter")


def _breaker_seen(daemon: AgentDaemon) -> object:
    """What of the breaker /metrics shows, as last read (a read between ticks changes the body)."""
    from trainguard.agent.assemble import remediation_of

    remediation = remediation_of(daemon)
    if remediation is None:
        return None
    r = remediation.breaker_view.latest()
    return (r.state, r.stale)


class MetricsView:
    """The /metrics body for a daemon, rendered at most once per tick (and breaker reading)."""

    def __init__(self, daemon: AgentDaemon) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(daemon))
        ProcessCollector(registry=self.registry)
        self.daemon = daemon
        self._lock = threading.Lock()
        self._cached: tuple[tuple[int, object], bytes] = ((-1, None), b"")

    def render(self) -> bytes:
        key = (self.daemon.snapshot.seq, _breaker_seen(self.daemon))
        cached = self._cached
        if cached[0] == key:
            return cached[1]
        with self._lock:
            if self._cached[0] != key:
                self._cached = (key, generate_latest(self.registry))
            return self._cached[1]
