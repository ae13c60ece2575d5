"""What a ResourceClaim asks of this node's plugin, read from its status.allocation: pure.

The allocation names, per request, the driver, pool and device the scheduler chose; only the
results of this plugin's driver and this node's pool are ours. Its opaque config (from the
DeviceClass, then the claim: later ones win, key by key) for this driver is a ``GpuConfig``:

    apiVersion: <driver>/v1   kind: GpuConfig
    driverTree: r560            a registered [drivers.NAME] tree (never a path)
    capabilities: compute,utility   NVIDIA_DRIVER_CAPABILITIES' grammar (default: compute,utility)
    require: "cuda>=12.4 brand=tesla"   NVIDIA_REQUIRE_*'s grammar, checked at prepare

Anything else in it is refused with a line that names it: a claim that cannot work fails at
prepare, in the claim's error, not as a container that starts broken.
"""

from __future__ import annotations

from dataclasses import dataclass

from ponytail.errors import InputError

CONFIG_KIND = "GpuConfig"
CONFIG_KEYS = ("apiVersion", "kind", "driverTree", "capabilities", "require")
DEFAULT_CAPABILITIES = "compute,utility"


@dataclass(frozen=True)
class Allocated:
    request: str
    pool: str
    device: str


@dataclass(frozen=True)
class ClaimWork:
    """What preparing one claim means on this node."""

    uid: str
    namespace: str
    name: str
    devices: tuple[Allocated, ...]
    driver_tree: str | None
    capabilities: str
    require: str


def claim_work(claim: object, uid: str, driver: str, pool: str) -> ClaimWork:
    """The work of ``claim`` (a ResourceClaim as the API server returns it) for ``driver``'s
    ``pool``; InputError (one line) when it cannot be prepared here."""
    if not isinstance(claim, dict):
        raise InputError("the API server returned no ResourceClaim object")
    meta = claim.get("metadata") or {}
    where = f"ResourceClaim {meta.get('namespace')}/{meta.get('name')}"
    if meta.get("uid") != uid:
        raise InputError(f"{where} has uid {meta.get('uid')!r}, not {uid!r}: it was deleted and made again; the kubelet retries with the new one")
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, dict):
        raise InputError(f"{where} is not allocated (no status.allocation)")
    devices = (allocation.get("devices") or {})
    results = devices.get("results") or []
    ours = tuple(
        Allocated(str(r.get("request", "")), str(r.get("pool", "")), str(r.get("device", "")))
        for r in results if isinstance(r, dict) and r.get("driver") == driver and r.get("pool") == pool
    )
    if not ours:
        raise InputError(f"{where} has no device of driver {driver} in pool {pool} (this node's)")
    requests = {a.request for a in ours}
    merged: dict = {}
    for entry in devices.get("config") or []:
        opaque = entry.get("opaque") if isinstance(entry, dict) else None
        if not isinstance(opaque, dict) or opaque.get("driver") != driver:
            continue
        named = entry.get("requests") or []
        if named and not requests & {r.split("/")[0] for r in named}:
            continue
        merged.update(_config(opaque.get("parameters"), driver, where))
    tree = merged.get("driverTree")
    return ClaimWork(uid, str(meta.get("namespace", "")), str(meta.get("name", "")), ours, tree or None,
                     merged.get("capabilities") or DEFAULT_CAPABILITIES, merged.get("require") or "")


def _config(parameters: object, driver: str, where: str) -> dict[str, str]:
    if not isinstance(parameters, dict):
        raise InputError(f"{where}: the opaque config of {driver} must be an object ({CONFIG_KIND})")
    unknown = sorted(set(parameters) - set(CONFIG_KEYS))
    if unknown:
        raise InputError(f"{where}: unknown field(s) {', '.join(unknown)} in the {CONFIG_KIND} config (known: {', '.join(CONFIG_KEYS[2:])})")
    if parameters.get("kind", CONFIG_KIND) != CONFIG_KIND:
        raise InputError(f"{where}: the opaque config of {driver} has kind {parameters.get('kind')!r}, not {CONFIG_KIND}")
    api = parameters.get("apiVersion")
    if api is not None and api != f"{driver}/v1":
        raise InputError(f"{where}: the {CONFIG_KIND} config has apiVersion {api!r}, not {driver}/v1")
    values = {}
    for key in CONFIG_KEYS[2:]:
        if key in parameters:
            if not isinstance(parameters[key], str):
                raise InputError(f"{where}: {CONFIG_KIND} {key} must be a string, not {type(parameters[key]).__name__}")
            values[key] = parameters[key].strip()
    return values
