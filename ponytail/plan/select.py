"""Which GPUs and MIG devices of the probed host a container's device request names (the
request read by ponytail.container.request, the GPUs by ponytail.host.probe)."""

from __future__ import annotations

from ponytail.container.request import is_number
from ponytail.errors import InputError, quoted
from ponytail.host.driver import canonical_bus_id
from ponytail.host.mig import MigDevice
from ponytail.host.records import Gpu
from ponytail.lite.records import record

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported on the hook's path: for type checkers only
    from collections.abc import Callable

    from ponytail.container.request import DeviceRequest


@record(frozen=True)
class Selection:
    """Whole GPUs and MIG devices a request names, in the order it names them."""

    gpus: tuple[Gpu, ...] = ()
    migs: tuple[MigDevice, ...] = ()


def select_devices(
    gpus: tuple[Gpu, ...], request: DeviceRequest, mig_uuids: Callable[[], dict[str, tuple[int, int, int]]] | None = None
) -> Selection:
    """Resolve ``all``, ``none``, and comma lists of indices, ``GPU-`` UUIDs, PCI bus ids
    (16- or 32-bit domain, or none), MIG devices as ``GPU:GI:CI`` indices or ``MIG-``
    UUIDs (asked of NVML through ``mig_uuids``, only when one is named). Anything
    else is an error naming it."""
    text = request.selector.strip()
    if text.lower() == "all":
        return Selection(gpus)
    if text.lower() in ("none", "", "void"):
        return Selection()
    chosen: list[Gpu] = []
    migs: list[MigDevice] = []
    uuids: dict[str, tuple[int, int, int]] | None = None
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if item.upper().startswith("MIG-"):
            if uuids is None:
                uuids = mig_uuids() if mig_uuids is not None else {}
            mig = _mig_by_uuid(gpus, uuids, item)
        elif _is_mig_index(item):
            mig = _mig_by_index(gpus, item)
        else:
            gpu = _find(gpus, item)
            if gpu is None:
                raise _unknown(gpus, request, item)
            if gpu not in chosen:
                chosen.append(gpu)
            continue
        if mig is None:
            raise _unknown(gpus, request, item, mig=True)
        if mig not in migs:
            migs.append(mig)
    return Selection(tuple(chosen), tuple(migs))


def select_gpus(gpus: tuple[Gpu, ...], request: DeviceRequest) -> tuple[Gpu, ...]:
    """Whole GPUs only (for the MIG config/monitor requests)."""
    return select_devices(gpus, request).gpus


def find_device(gpus: tuple[Gpu, ...], name: str) -> Gpu | MigDevice | None:
    """The GPU or MIG device one name of the request grammar means (an index, a ``GPU-`` UUID in
    any case, a PCI bus id, ``GPU:GI:CI``), as select_devices reads it; None when it names
    nothing here, or is a ``MIG-`` UUID (which only NVML can resolve)."""
    name = name.strip()
    if name.upper().startswith("MIG-"):
        return None
    if _is_mig_index(name):
        return _mig_by_index(gpus, name)
    return _find(gpus, name)


def _is_mig_index(item: str) -> bool:
    return item.count(":") == 2 and all(is_number(p) for p in item.split(":"))


def names_by_identity(request: DeviceRequest) -> bool:
    """Whether ``request`` names its GPUs only by what stays true when indices shift (GPU- and
    MIG- UUIDs, PCI bus ids), or none: not ``all``, an index or a MIG device's GPU:GI:CI."""
    text = request.selector.strip()
    if text.lower() in ("none", "", "void"):
        return True
    items = [part.strip() for part in text.split(",") if part.strip()]
    return all(
        item.upper().startswith(("GPU-", "MIG-")) or (not is_number(item) and canonical_bus_id(item) is not None) for item in items
    )


def _mig_by_index(gpus: tuple[Gpu, ...], item: str) -> MigDevice | None:
    index, gi, ci = (int(p) for p in item.split(":"))
    if index >= len(gpus):
        return None
    return next((m for m in gpus[index].mig_devices if (m.gi, m.ci) == (gi, ci)), None)


def _mig_by_uuid(gpus: tuple[Gpu, ...], uuids: dict[str, tuple[int, int, int]], item: str) -> MigDevice | None:
    found = next((v for k, v in uuids.items() if k.lower() == item.lower()), None)
    if found is None:
        return None
    minor, gi, ci = found
    gpu = next((g for g in gpus if g.minor == minor), None)
    if gpu is None:
        return None
    return next((m for m in gpu.mig_devices if (m.gi, m.ci) == (gi, ci)), None)


def _unknown(gpus: tuple[Gpu, ...], request: DeviceRequest, item: str, mig: bool = False) -> InputError:
    if mig:
        have = [m.name for g in gpus for m in g.mig_devices]
        listing = f"MIG devices {', '.join(have)}" if have else "no MIG devices"
        return InputError(f"unknown MIG device {quoted(item)} in {request.source}={quoted(request.selector)}: this host has {listing}")
    return InputError(f"unknown GPU {quoted(item)} in {request.source}={quoted(request.selector)}: this host has {_describe(gpus)}")


def _find(gpus: tuple[Gpu, ...], item: str) -> Gpu | None:
    if is_number(item):
        index = int(item)
        return gpus[index] if index < len(gpus) else None
    if item.upper().startswith("GPU-"):
        return next((g for g in gpus if g.uuid.lower() == item.lower()), None)
    bus_id = canonical_bus_id(item)
    if bus_id is not None:
        return next((g for g in gpus if g.pci_bus_id == bus_id), None)
    return None


def _describe(gpus: tuple[Gpu, ...]) -> str:
    if not gpus:
        return "no GPUs"
    if len(gpus) == 1:
        return f"1 GPU (index 0, {gpus[0].pci_bus_id}, {gpus[0].uuid})"
    return f"{len(gpus)} GPUs (indices 0-{len(gpus) - 1}; see 'ponytail info')"
