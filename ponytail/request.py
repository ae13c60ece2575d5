"""What a container asks for, and which GPUs that means on this host."""

from __future__ import annotations

from dataclasses import dataclass

from ponytail.errors import InputError
from ponytail.host.driver import canonical_bus_id
from ponytail.host.probe import Gpu

VISIBLE_DEVICES_VAR = "NVIDIA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class DeviceRequest:
    """``selector`` as written (``all``, ``none``, ``void``, ``0,GPU-...``) and who wrote it."""

    selector: str
    source: str

    @property
    def is_void(self) -> bool:
        """Not a GPU container at all: inject nothing."""
        return self.selector.strip().lower() in ("", "void")


def device_request(cli_device: str | None, env: dict[str, str] | None) -> DeviceRequest:
    """``-device`` wins; then the container's NVIDIA_VISIBLE_DEVICES; then ``all``."""
    if cli_device is not None:
        return DeviceRequest(cli_device, "-device")
    if env is not None and VISIBLE_DEVICES_VAR in env:
        return DeviceRequest(env[VISIBLE_DEVICES_VAR], VISIBLE_DEVICES_VAR)
    return DeviceRequest("all", "default")


def select_gpus(gpus: tuple[Gpu, ...], request: DeviceRequest) -> tuple[Gpu, ...]:
    """The GPUs ``request`` names, in the order it names them (no duplicates).

    Accepts ``all``, ``none``, and comma lists of indices, ``GPU-`` UUIDs and PCI
    bus ids (16- or 32-bit domain, or none). Anything else is an error naming it.
    """
    text = request.selector.strip()
    if text.lower() == "all":
        return gpus
    if text.lower() in ("none", "", "void"):
        return ()
    chosen: list[Gpu] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        gpu = _find(gpus, item)
        if gpu is None:
            raise InputError(
                f"unknown GPU {item!r} in {request.source}={request.selector!r}: this host has {_describe(gpus)}"
            )
        if gpu not in chosen:
            chosen.append(gpu)
    return tuple(chosen)


def _find(gpus: tuple[Gpu, ...], item: str) -> Gpu | None:
    if item.isdigit():
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
