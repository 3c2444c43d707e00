"""A fake Kubernetes API server on loopback that records every request (there is no cluster here).

It serves one Node object and applies the patches the remediation provider sends the way the API
server does for these fields: ``spec`` fields replace (``taints`` has no merge key), ``status.conditions``
merge by ``type``, and a ``metadata.resourceVersion`` that is not the current one is a 409.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeApiServer:
    def __init__(self, node: str) -> None:
        self.node_name = node
        self.node: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node, "uid": "0b1c-uid", "resourceVersion": "1"},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
        self.requests: list[tuple[str, str, Any]] = []  # (method, path, JSON body)
        self.events: list[dict[str, Any]] = []
        self.conflicts = 0  # answer this many PATCHes with 409 (another writer got there first)
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _body(self) -> Any:
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n)) if n else None

            def _send(self, code: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                outer.handle(self, "GET", None)

            def do_PATCH(self) -> None:
                outer.handle(self, "PATCH", self._body())

            def do_POST(self) -> None:
                outer.handle(self, "POST", self._body())

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def handle(self, h: Any, method: str, body: Any) -> None:
        path = h.path.split("?")[0]
        with self.lock:
            self.requests.append((method, path, body))
            node_path = f"/api/v1/nodes/{self.node_name}"
            if method == "GET" and path == node_path:
                return h._send(200, self.node)
            if method == "PATCH" and path == node_path:
                want = (body.get("metadata") or {}).get("resourceVersion")
                if self.conflicts or (want and want != self.node["metadata"]["resourceVersion"]):
                    self.conflicts = max(0, self.conflicts - 1)
                    return h._send(409, _status(409, "Conflict"))
                self.node["spec"].update(body.get("spec", {}))
                self._bump()
                return h._send(200, self.node)
            if method == "PATCH" and path == node_path + "/status":
                conds = {c["type"]: c for c in self.node["status"]["conditions"]}
                for c in body["status"]["conditions"]:
                    conds[c["type"]] = c
                self.node["status"]["conditions"] = list(conds.values())
                self._bump()
                return h._send(200, self.node)
            if method == "POST" and path.startswith("/api/v1/namespaces/") and path.endswith("/events"):
                ev = dict(body)
                ev.setdefault("metadata", {})["name"] = ev["metadata"].get("generateName", "") + str(
                    len(self.events)
                )
                self.events.append(ev)
                return h._send(201, ev)
            return h._send(404, _status(404, "NotFound"))

    def _bump(self) -> None:
        md = self.node["metadata"]
        md["resourceVersion"] = str(int(md["resourceVersion"]) + 1)

    def __enter__(self) -> FakeApiServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _status(code: int, reason: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": reason, "code": code}
