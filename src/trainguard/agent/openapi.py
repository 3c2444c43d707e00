"""The OpenAPI 3.1 description of the agent's read-only API, served at ``/api/v1/openapi.json``."""

from __future__ import annotations

import functools
import json
from typing import Any

from trainguard import __version__


def _get(
    summary: str, params: tuple[tuple[str, str, str], ...] = (), schema: str = "object"
) -> dict[str, Any]:
    return {
        "get": {
            "summary": summary,
            "parameters": [
                {"name": n, "in": "query", "required": False, "description": doc, "schema": {"type": t}}
                for n, t, doc in params
            ],
            "responses": {
                "200": {"description": "OK", "content": {"application/json": {"schema": {"type": schema}}}},
                "401": {"description": "no token, or a wrong one"},
                "429": {"description": "rate limit exceeded"},
            },
        }
    }


SPEC: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "trainguard node agent",
        "version": __version__,
        "description": "Read-only view of one GPU node: readings, verdicts, findings, incidents, job goodput.",
    },
    "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    "security": [{"bearer": []}],
    "paths": {
        "/healthz": {
            "get": {
                "summary": "The agent's own health (no token needed, no rate limit)",
                "security": [],
                "responses": {
                    "200": {"description": "OK"},
                    "503": {"description": "the sampling loop stalled"},
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus exposition (dcgm-exporter names plus trainguard_*); the read "
                "token or the scrape token (scrape_token_file: this route only, served first)",
                "responses": {"200": {"description": "OK"}},
            }
        },
        "/api/v1/node": _get("Node verdict, its reasons and the agent's health"),
        "/api/v1/verdict": _get(
            "The last tick's whole NodeVerdict (every finding), for a supervisor on this node"
        ),
        "/api/v1/gpus": _get("Every GPU with its latest reading and verdict", schema="array"),
        "/api/v1/gpus/{index}": {
            **_get("One GPU"),
            "parameters": [{"name": "index", "in": "path", "required": True, "schema": {"type": "integer"}}],
        },
        "/api/v1/findings": _get(
            "Findings of the latest tick",
            (("gpu", "integer", "only this GPU"), ("health", "string", "ok | unknown | degraded | failed")),
            "array",
        ),
        "/api/v1/history": _get(
            "Recent chart points per GPU (time, temperature_c, power_w, sm_clock_mhz, mem_used_pct, util_gpu_pct, ecc_errors)",
            (("since", "number", "only points after this time"),),
        ),
        "/api/v1/incidents": _get(
            "Incidents, newest first, with filters and paging",
            (
                ("job", "string", "job id (node incidents: node:<hostname>)"),
                ("node", "string", "hostname"),
                ("gpu", "integer", "GPU index"),
                ("root_cause", "string", "e.g. faulty_gpu"),
                ("category", "string", "e.g. gpu_memory_ecc"),
                ("since", "number", "detected at or after (epoch seconds)"),
                ("until", "number", "detected at or before (epoch seconds)"),
                ("limit", "integer", "page size, 1..500 (default 50)"),
                ("offset", "integer", "items to skip"),
            ),
        ),
        "/api/v1/jobs": _get(
            "The most recently started jobs with their goodput and ETTR",
            (("limit", "integer", "how many, 1..500 (default 50)"),),
            "array",
        ),
    },
}


@functools.cache
def spec_bytes() -> bytes:
    return json.dumps(SPEC, indent=1).encode()
