"""A fake Kubernetes API server on loopback that records every request (there is no cluster here).

It serves Node objects and applies the patches the remediation provider sends the way the API
server does for these fields: ``spec`` fields replace (``taints`` has no merge key), ``status.conditions``
merge by ``type``, and a ``metadata.resourceVersion`` that is not the current one is a 409. With an
``admission`` (tests/k8s_admission.py) every write goes through the deploy/ admission policy as
the request's ``user``, before it is stored: refused, it is a 403 and nothing changes.
"""

from __future__ import annotations

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def make_node(name: str, uid: str = "0b1c-uid") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": uid,
            "resourceVersion": "1",
            "labels": {"kubernetes.io/hostname": name},
        },
        "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}], "capacity": {"nvidia.com/gpu": "8"}},
    }


class FakeApiServer:
    def __init__(
        self, node: str, *, others: tuple[str, ...] = (), admission: Any = None, user: Any = None
    ) -> None:
        self.node_name = node
        self.nodes: dict[str, dict[str, Any]] = {
            n: make_node(n, uid=f"uid-{n}") if n != node else make_node(n) for n in (node, *others)
        }
        self.node = self.nodes[node]
        self.admission, self.user = admission, user
        self.refused: list[str] = []  # messages of writes the admission policy refused
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
            parts = path.strip("/").split("/")
            node = (
                self.nodes.get(parts[3]) if parts[:3] == ["api", "v1", "nodes"] and len(parts) > 3 else None
            )
            sub = "/".join(parts[4:])
            if node is not None and method == "GET" and not sub:
                return h._send(200, node)
            if node is not None and method == "PATCH" and sub in ("", "status"):
                want = (body.get("metadata") or {}).get("resourceVersion")
                if not sub and (self.conflicts or (want and want != node["metadata"]["resourceVersion"])):
                    self.conflicts = max(0, self.conflicts - 1)
                    return h._send(409, _status(409, "Conflict"))
                new = copy.deepcopy(node)
                if sub:
                    conds = {c["type"]: c for c in new["status"]["conditions"]}
                    for c in body["status"]["conditions"]:
                        conds[c["type"]] = c
                    new["status"]["conditions"] = list(conds.values())
                else:
                    new["spec"].update(body.get("spec", {}))
                    for key in ("labels", "annotations"):
                        if key in (body.get("metadata") or {}):
                            new["metadata"][key] = {**new["metadata"].get(key, {}), **body["metadata"][key]}
                if self.admission is not None:
                    resource = "nodes/status" if sub else "nodes"
                    refused = self.admission.review(self.user, resource, "UPDATE", new, node)
                    if refused is not None:
                        self.refused.append(refused)
                        return h._send(403, _status(403, "Forbidden", refused))
                node.clear()
                node.update(new)
                self._bump(node)
                return h._send(200, node)
            if method == "POST" and path.startswith("/api/v1/namespaces/") and path.endswith("/events"):
                ev = dict(body)
                ev.setdefault("metadata", {})["name"] = ev["metadata"].get("generateName", "") + str(
                    len(self.events)
                )
                ev["metadata"]["namespace"] = parts[3]
                self.events.append(ev)
                return h._send(201, ev)
            return h._send(404, _status(404, "NotFound"))

    def _bump(self, node: dict[str, Any]) -> None:
        md = node["metadata"]
        md["resourceVersion"] = str(int(md["resourceVersion"]) + 1)

    def __enter__(self) -> FakeApiServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _status(code: int, reason: str, message: str = "") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": reason, "code": code,
            "message": message}  # fmt: skip
