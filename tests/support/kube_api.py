"""A stand-in Kubernetes API server for the DRA plugin's tests: ResourceSlices and ResourceClaims of
``resource.k8s.io/v1`` over the REST paths the ``kubernetes`` client uses, on 127.0.0.1.

Every write is VALIDATED as a real API server would: against the OpenAPI schema Kubernetes 1.36.2
serves for the group (../shared/kubernetes/resource.k8s.io-v1-openapi-1.36.2.json; types, required
fields, enums, and no unknown field: the strict field validation kubectl asks for), and against
the rules the server's Go validation adds that the schema cannot say (DNS names, attribute names and
values, semantic versions, the 32-attribute and 64-character limits, a PUT's resourceVersion). A
write that fails is answered 422 (409 for a stale resourceVersion) with the reason, and recorded
in ``refused`` so that a test can say what the plugin sent.
"""

from __future__ import annotations

import json
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from support.commands import REPO

SCHEMA_NAME = "resource.k8s.io-v1-openapi-1.36.2.json"


def _schema_path() -> Path:
    """../shared/kubernetes beside the clone (CI), else beside a directory above it (a worktree), or KUBERNETES_SHARED."""
    if os.environ.get("KUBERNETES_SHARED"):
        return Path(os.environ["KUBERNETES_SHARED"]) / SCHEMA_NAME
    for above in REPO.parents:
        if (above / "shared/kubernetes" / SCHEMA_NAME).exists():
            return above / "shared/kubernetes" / SCHEMA_NAME
    return REPO.parent / "shared/kubernetes" / SCHEMA_NAME


SCHEMA = _schema_path()
GROUP = "/apis/resource.k8s.io/v1"
PREFIX = "io.k8s.api.resource.v1."

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class Invalid(Exception):
    pass


class SchemaValidator:
    """The OpenAPI document's schemas, $refs and allOf resolved as they are met."""

    def __init__(self, path: Path = SCHEMA) -> None:
        self.schemas = json.loads(path.read_text())["components"]["schemas"]

    def validate(self, obj: object, type_name: str) -> None:
        self._check(obj, {"$ref": f"#/components/schemas/{PREFIX}{type_name}"}, type_name)

    def _resolve(self, schema: dict) -> dict:
        while True:
            if "$ref" in schema:
                schema = self.schemas[schema["$ref"].rsplit("/", 1)[1]]
            elif "allOf" in schema and len(schema["allOf"]) == 1:
                schema = {**{k: v for k, v in schema.items() if k != "allOf"}, **schema["allOf"][0]}
            else:
                return schema

    def _check(self, obj: object, schema: dict, where: str) -> None:
        schema = self._resolve(schema)
        kind = schema.get("type")
        if obj is None:
            if kind is not None and not schema.get("nullable"):
                raise Invalid(f"{where}: null where {kind} is required")
            return
        if "enum" in schema and obj not in schema["enum"]:
            raise Invalid(f"{where}: {obj!r} is none of {schema['enum']}")
        if schema.get("format") == "int-or-string" or schema.get("x-kubernetes-int-or-string"):
            if not isinstance(obj, (int, str)):
                raise Invalid(f"{where}: {obj!r} is neither an integer nor a string")
            return
        if kind == "object" or "properties" in schema:
            if not isinstance(obj, dict):
                raise Invalid(f"{where}: {type(obj).__name__} where an object is required")
            for name in schema.get("required", []):
                if name not in obj:
                    raise Invalid(f"{where}: required field {name!r} is missing")
            properties = schema.get("properties")
            extra = schema.get("additionalProperties")
            for key, value in obj.items():
                if properties is not None and key in properties:
                    self._check(value, properties[key], f"{where}.{key}")
                elif isinstance(extra, dict):
                    self._check(value, extra, f"{where}[{key}]")
                elif properties is not None or extra is False:
                    raise Invalid(f"{where}: unknown field {key!r}")
        elif kind == "array":
            if not isinstance(obj, list):
                raise Invalid(f"{where}: {type(obj).__name__} where an array is required")
            for i, item in enumerate(obj):
                self._check(item, schema.get("items", {}), f"{where}[{i}]")
        elif kind == "string":
            if not isinstance(obj, str):
                raise Invalid(f"{where}: {obj!r} is not a string")
        elif kind == "integer":
            if not isinstance(obj, int) or isinstance(obj, bool):
                raise Invalid(f"{where}: {obj!r} is not an integer")
        elif kind == "boolean":
            if not isinstance(obj, bool):
                raise Invalid(f"{where}: {obj!r} is not a boolean")
        elif kind == "number":
            if not isinstance(obj, (int, float)) or isinstance(obj, bool):
                raise Invalid(f"{where}: {obj!r} is not a number")


def _qualified_name(name: str, where: str) -> None:
    domain, _, short = name.rpartition("/")
    if domain and (len(domain) > 63 or not _DNS_SUBDOMAIN.match(domain)):
        raise Invalid(f"{where}: {domain!r} is not a DNS subdomain of at most 63 characters")
    if not short or len(short) > 32 or not _C_IDENTIFIER.match(short):
        raise Invalid(f"{where}: {short!r} is not a C identifier of at most 32 characters")


def validate_slice_rules(obj: dict) -> None:
    """What the API server's Go validation of a ResourceSlice adds to the schema (the subset a plugin meets)."""
    name = obj.get("metadata", {}).get("name", "")
    if not name or len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        raise Invalid(f"metadata.name {name!r} is not a DNS subdomain")
    spec = obj["spec"]
    if not _DNS_SUBDOMAIN.match(spec["driver"]) or len(spec["driver"]) > 63:
        raise Invalid(f"spec.driver {spec['driver']!r} is not a DNS subdomain of at most 63 characters")
    pool = spec["pool"]
    if pool["generation"] < 0 or pool["resourceSliceCount"] < 1 or not pool["name"]:
        raise Invalid("spec.pool: generation >= 0, resourceSliceCount >= 1 and a name are required")
    if sum(1 for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if spec.get(k)) != 1:
        raise Invalid("spec: exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection is required")
    devices = spec.get("devices") or []
    if len(devices) > 128:
        raise Invalid(f"spec.devices: {len(devices)} devices, at most 128")
    seen = set()
    for i, device in enumerate(devices):
        where = f"spec.devices[{i}]"
        if not _DNS_LABEL.match(device["name"]) or len(device["name"]) > 63:
            raise Invalid(f"{where}.name {device['name']!r} is not a DNS label")
        if device["name"] in seen:
            raise Invalid(f"{where}.name {device['name']!r} is listed twice")
        seen.add(device["name"])
        attributes = device.get("attributes") or {}
        if len(attributes) + len(device.get("capacity") or {}) > 32:
            raise Invalid(f"{where}: more than 32 attributes and capacities")
        for key, value in attributes.items():
            _qualified_name(key, f"{where}.attributes[{key}]")
            set_fields = [k for k, v in value.items() if v is not None]
            if len(set_fields) != 1:
                raise Invalid(f"{where}.attributes[{key}]: exactly one value is required, found {set_fields}")
            if "string" in value and len(value["string"]) > 64:
                raise Invalid(f"{where}.attributes[{key}].string: longer than 64 characters")
            if "version" in value and (len(value["version"]) > 64 or not _SEMVER.match(value["version"])):
                raise Invalid(f"{where}.attributes[{key}].version {value['version']!r} is not a semantic version")
        for j, taint in enumerate(device.get("taints") or []):
            _qualified_name(taint["key"], f"{where}.taints[{j}].key")
            if len(taint.get("value", "")) > 63 or not _LABEL_VALUE.match(taint.get("value", "")):
                raise Invalid(f"{where}.taints[{j}].value {taint.get('value')!r} is not a label value")
            if taint["effect"] not in ("NoSchedule", "NoExecute", "None"):
                raise Invalid(f"{where}.taints[{j}].effect {taint['effect']!r}")


class KubeApi:
    """The server, its objects (``slices`` by name, ``claims`` by namespace/name) and the writes it refused."""

    def __init__(self, schema: Path = SCHEMA) -> None:
        self.validator = SchemaValidator(schema)
        self.slices: dict[str, dict] = {}
        self.claims: dict[tuple[str, str], dict] = {}
        self.refused: list[str] = []
        self.writes: list[tuple[str, str]] = []  # (method, path) of each accepted write
        self.lock = threading.Lock()
        self.version = 0
        self.claim_reads = threading.Event()  # set at each GET of a claim
        self.claim_delay = 0.0  # seconds a GET of a claim waits before its answer
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _body(self) -> dict:
                length = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(length)) if length else {}

            def _send(self, status: int, obj: object) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _dispatch(self, method: str) -> None:
                url = urlparse(self.path)
                try:
                    status, obj = api.handle(method, url.path, parse_qs(url.query), self._body() if method in ("POST", "PUT") else None)
                except Invalid as e:
                    api.refused.append(f"{method} {url.path}: {e}")
                    status, obj = 422, _status(422, f"ResourceSlice is invalid: {e}")
                self._send(status, obj)

            def do_GET(self) -> None:  # noqa: N802 - http.server's names
                self._dispatch("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._dispatch("POST")

            def do_PUT(self) -> None:  # noqa: N802
                self._dispatch("PUT")

            def do_DELETE(self) -> None:  # noqa: N802
                self._dispatch("DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": self.url}}],
            "users": [{"name": "test", "user": {"token": "test-token"}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        }))
        return path

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def add_claim(self, claim: dict) -> dict:
        """A ResourceClaim as the scheduler leaves it (allocated), checked against the schema like a write."""
        self.validator.validate(claim, "ResourceClaim")
        meta = claim["metadata"]
        with self.lock:
            self.version += 1
            meta["resourceVersion"] = str(self.version)
            self.claims[(meta["namespace"], meta["name"])] = claim
        return claim

    def handle(self, method: str, path: str, query: dict, body: dict | None) -> tuple[int, object]:
        if not path.startswith(GROUP + "/"):
            return 404, _status(404, f"{path} not found")
        parts = path[len(GROUP) + 1:].split("/")
        if "resourceclaims" in parts and self.claim_delay:
            import time

            self.claim_reads.set()
            time.sleep(self.claim_delay)
        with self.lock:
            if parts[0] == "resourceslices":
                return self._slices(method, parts[1] if len(parts) > 1 else None, query, body)
            if parts[0] == "namespaces" and len(parts) == 4 and parts[2] == "resourceclaims" and method == "GET":
                self.claim_reads.set()
                claim = self.claims.get((parts[1], parts[3]))
                return (200, claim) if claim is not None else (404, _status(404, f'resourceclaims "{parts[3]}" not found'))
        return 405, _status(405, f"{method} {path} is not served by the stand-in")

    def _slices(self, method: str, name: str | None, query: dict, body: dict | None) -> tuple[int, object]:
        if name is None and method == "GET":
            items = list(self.slices.values())
            for selector in (query.get("fieldSelector") or [""])[0].split(","):
                if selector:
                    key, _, value = selector.partition("=")
                    items = [s for s in items if s["spec"].get(key.removeprefix("spec.")) == value]
            return 200, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList", "metadata": {"resourceVersion": str(self.version)},
                         "items": items}
        if name is None and method == "POST":
            assert body is not None
            self._validate_write(body)
            if body["metadata"]["name"] in self.slices:
                return 409, _status(409, f'resourceslices "{body["metadata"]["name"]}" already exists')
            return 201, self._store(body, "POST")
        if name is not None and method == "GET":
            found = self.slices.get(name)
            return (200, found) if found else (404, _status(404, f'resourceslices "{name}" not found'))
        if name is not None and method == "PUT":
            assert body is not None
            self._validate_write(body)
            old = self.slices.get(name)
            if old is None:
                return 404, _status(404, f'resourceslices "{name}" not found')
            if body["metadata"].get("resourceVersion") != old["metadata"]["resourceVersion"]:
                return 409, _status(409, "the object has been modified; please apply your changes to the latest version and try again")
            return 200, self._store(body, "PUT")
        if name is not None and method == "DELETE":
            if self.slices.pop(name, None) is None:
                return 404, _status(404, f'resourceslices "{name}" not found')
            self.writes.append(("DELETE", name))
            return 200, _status(200, "deleted")
        return 405, _status(405, f"{method} resourceslices")

    def _validate_write(self, body: dict) -> None:
        if body.get("apiVersion") != "resource.k8s.io/v1" or body.get("kind") != "ResourceSlice":
            raise Invalid(f"apiVersion/kind {body.get('apiVersion')}/{body.get('kind')} is not resource.k8s.io/v1 ResourceSlice")
        self.validator.validate(body, "ResourceSlice")
        validate_slice_rules(body)

    def _store(self, body: dict, method: str) -> dict:
        self.version += 1
        stored = json.loads(json.dumps(body))
        stored["metadata"]["resourceVersion"] = str(self.version)
        stored["metadata"].setdefault("uid", f"slice-{self.version}")
        self.slices[stored["metadata"]["name"]] = stored
        self.writes.append((method, stored["metadata"]["name"]))
        return stored


def _status(code: int, message: str) -> dict:
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code, "message": message}


def allocated_claim(namespace: str, name: str, uid: str, driver: str, pool: str, devices: list[str], config: dict | None = None,
                    request: str = "gpu") -> dict:
    """A ResourceClaim as the scheduler leaves it: allocated ``devices`` of ``driver``'s ``pool``, with an opaque ``config``."""
    allocation: dict = {"devices": {"results": [{"request": request, "driver": driver, "pool": pool, "device": d} for d in devices]}}
    if config is not None:
        allocation["devices"]["config"] = [{"source": "FromClaim", "requests": [request], "opaque": {"driver": driver, "parameters": config}}]
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"devices": {"requests": [{"name": request, "exactly": {"deviceClassName": "gpu.ponytail.example.com", "count": len(devices)}}]}},
        "status": {"allocation": allocation},
    }
