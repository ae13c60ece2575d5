"""The node's GPUs as a ResourceSlice (resource.k8s.io/v1): pure.

One device per GPU, or per MIG device where MIG is on, from ponytail's probe (never NVML).
Device names are ``gpu-<index>`` and ``gpu-<index>-mig-<gi>-<ci>``, as NVIDIA's DRA driver names
them, so its claim templates select alike; the GPU behind a name is kept by UUID (``DeviceEntry``),
so a claim prepared after the GPUs were renumbered still gets the GPU that was allocated. The
attributes are what users select on: uuid, productName, brand, cudaComputeCapability, driverVersion,
cudaDriverVersion, index, minor, the PCI bus id (``resource.kubernetes.io/pciBusID``) and the
node's usable driver trees (``driverTrees``, comma-separated). A device with a health problem
carries a taint (ponytail.dra.health).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ponytail.container.require import arch_of, brand_of

API_VERSION = "resource.k8s.io/v1"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
MAX_STRING = 64  # a string attribute's limit on the API server


@dataclass(frozen=True)
class DeviceEntry:
    """A device of the slice and what it stands for on this node."""

    name: str
    gpu_uuid: str  # the whole GPU's (a MIG device's parent's)
    bus_id: str
    mig: tuple[int, int] | None = None  # (gi, ci) of a MIG device
    attributes: dict = field(default_factory=dict, compare=False)


def device_entries(gpus: tuple, driver_version: str, cuda_version: str | None, trees: list[str]) -> list[DeviceEntry]:
    """The devices to publish for ``gpus`` (ponytail.host.probe.Gpu records)."""
    common: dict = {"type": {"string": "gpu"}, "driverVersion": {"version": semver(driver_version)}}
    if cuda_version:
        common["cudaDriverVersion"] = {"version": semver(cuda_version)}
    tree_list = ",".join(trees)
    if tree_list and len(tree_list) <= MAX_STRING:
        common["driverTrees"] = {"string": tree_list}
    entries = []
    for gpu in gpus:
        attributes = dict(common)
        attributes.update({
            "uuid": {"string": gpu.uuid}, "productName": {"string": gpu.model[:MAX_STRING]}, "brand": {"string": brand_of(gpu.model)},
            "index": {"int": gpu.index}, "minor": {"int": gpu.minor}, PCI_BUS_ID: {"string": gpu.pci_bus_id.lower()},
        })
        capability = arch_of(gpu.model)  # the compute capability, from the model name
        if capability:
            attributes["cudaComputeCapability"] = {"version": semver(capability)}
        if not gpu.mig_enabled:
            entries.append(DeviceEntry(f"gpu-{gpu.index}", gpu.uuid, gpu.pci_bus_id, None, attributes))
            continue
        for mig in gpu.mig_devices:
            own = dict(attributes, type={"string": "mig"}, parentUUID={"string": gpu.uuid},
                       gpuInstance={"int": mig.gi}, computeInstance={"int": mig.ci})
            own.pop("uuid")  # a MIG device's own UUID needs NVML: its parent's names it
            entries.append(DeviceEntry(f"gpu-{gpu.index}-mig-{mig.gi}-{mig.ci}", gpu.uuid, gpu.pci_bus_id, (mig.gi, mig.ci), own))
    return entries


def slice_object(driver: str, node: str, generation: int, entries: list[DeviceEntry], taints: dict[str, list[dict]]) -> dict:
    """The ResourceSlice of ``node``'s pool (named after the node) with ``entries``; ``taints`` by device name."""
    devices = []
    for entry in entries:
        device: dict = {"name": entry.name, "attributes": entry.attributes}
        if taints.get(entry.name):
            device["taints"] = taints[entry.name]
        devices.append(device)
    return {
        "apiVersion": API_VERSION, "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node, driver)},
        "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                 "devices": devices},
    }


def slice_name(node: str, driver: str) -> str:
    """``<node>-<driver>``: a DNS subdomain of both (each is one), cut to the API's 253 characters."""
    return f"{node}-{driver}"[:253].rstrip("-.")


def semver(version: str) -> str:
    """A driver or CUDA version as semantic version 2.0 (what a ``version`` attribute must be):
    three numeric parts without leading zeros (535.104.05 -> 535.104.5, 12.4 -> 12.4.0)."""
    parts = [p for p in version.strip().split(".") if p]
    numbers = [str(int(p)) if p.isascii() and p.isdigit() else "0" for p in parts[:3]]
    return ".".join(numbers + ["0"] * (3 - len(numbers)))
