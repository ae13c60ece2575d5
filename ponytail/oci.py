"""OCI state (stdin) + the bundle's config.json -> Container. Bounded, validated, one-line errors."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from ponytail.errors import InputError

MAX_STATE_BYTES = 4 << 20
MAX_BUNDLE_CONFIG_BYTES = 4 << 20


@dataclass(frozen=True)
class Container:
    id: str
    pid: int
    bundle: str
    rootfs: str  # absolute path, as the runtime sees it in the container's mount namespace
    status: str
    env: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    cgroups_path: str | None = None
    privileged: bool = False  # CAP_SYS_ADMIN in the process's bounding set


def read_bounded(stream, limit: int, what: str) -> bytes:  # type: ignore[no-untyped-def]
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise InputError(f"{what} is larger than {limit} bytes; refusing to parse it")
    return data


def parse_json_object(raw: bytes, what: str) -> dict:
    if not raw.strip():
        raise InputError(f"{what} is empty")
    try:
        value = json.loads(raw)
    except RecursionError:
        raise InputError(f"{what} is nested too deeply")
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"{what} is not valid JSON: {e}")
    if not isinstance(value, dict):
        raise InputError(f"{what} must be a JSON object, not {type(value).__name__}")
    return value


def container_from_state(raw_state: bytes) -> Container:
    """Parse the OCI state from stdin and read the bundle's config.json it points at."""
    state = parse_json_object(raw_state, "OCI state on stdin")
    container_id = _field(state, "id", str, "OCI state")
    pid = state.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        raise InputError(f"OCI state for container {container_id}: 'pid' must be a positive integer, got {pid!r}")
    bundle = _field(state, "bundle", str, "OCI state")
    status = state.get("status", "")
    if not isinstance(status, str):
        raise InputError(f"OCI state for container {container_id}: 'status' must be a string")
    if status == "stopped":
        raise InputError(f"container {container_id} is already stopped; nothing to inject")
    if not os.path.isabs(bundle):
        raise InputError(f"OCI state for container {container_id}: bundle {bundle!r} is not an absolute path")
    annotations = _string_map(state.get("annotations"), f"OCI state for container {container_id}: 'annotations'")
    spec = read_bundle_config(bundle)
    root = spec.get("root")
    root_path = root.get("path") if isinstance(root, dict) else None
    if not isinstance(root_path, str) or not root_path:
        raise InputError(f"{bundle}/config.json: 'root.path' is missing or not a string")
    rootfs = os.path.normpath(os.path.join(bundle, root_path))
    process = spec.get("process") if isinstance(spec.get("process"), dict) else {}
    env = parse_env(process.get("env"), f"{bundle}/config.json: 'process.env'")
    capabilities = process.get("capabilities") if isinstance(process.get("capabilities"), dict) else {}
    bounding = capabilities.get("bounding")
    privileged = isinstance(bounding, list) and "CAP_SYS_ADMIN" in bounding
    spec_annotations = _string_map(spec.get("annotations"), f"{bundle}/config.json: 'annotations'")
    linux = spec.get("linux") if isinstance(spec.get("linux"), dict) else {}
    cgroups_path = linux.get("cgroupsPath")
    return Container(
        id=container_id,
        pid=pid,
        bundle=bundle,
        rootfs=rootfs,
        status=status,
        env=env,
        annotations={**spec_annotations, **annotations},
        cgroups_path=cgroups_path if isinstance(cgroups_path, str) else None,
        privileged=privileged,
    )


def read_bundle_config(bundle: str) -> dict:
    path = os.path.join(bundle, "config.json")
    try:
        with open(path, "rb") as f:
            raw = read_bounded(f, MAX_BUNDLE_CONFIG_BYTES, path)
    except FileNotFoundError:
        what = "bundle directory" if not os.path.isdir(bundle) else "config.json"
        raise InputError(f"{path} not found (missing {what}); is the OCI state's 'bundle' right?")
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}")
    return parse_json_object(raw, path)


def parse_env(value: object, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, list):
        raise InputError(f"{what} must be a list of KEY=VALUE strings")
    env: dict[str, str] = {}
    for item in value:
        if not isinstance(item, str):
            raise InputError(f"{what} must be a list of KEY=VALUE strings, found {type(item).__name__}")
        key, sep, val = item.partition("=")
        if sep:
            env[key] = val
    return env


def _field(obj: dict, key: str, kind: type, what: str) -> str:
    value = obj.get(key)
    if not isinstance(value, kind) or not value:
        raise InputError(f"{what}: '{key}' is missing or not a {kind.__name__}")
    return value  # type: ignore[return-value]


def _string_map(value: object, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise InputError(f"{what} must be an object of strings")
    return dict(value)
