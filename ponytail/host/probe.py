"""Probe the host once: driver version, GPUs (and their MIG devices), device nodes,
driver files for the requested capabilities, daemons' sockets. Plain data out.

This module assembles the Host; its records are in host/records.py. The parts are beside
it: host/nodes.py (device nodes), host/features.py (the opt-in features, the daemons'
sockets), host/driver_search.py (the driver-file search, the host's ldconfig, a driver file
by name).

Never opens a GPU device node and never loads NVML: reading a few /proc and
/sys files is all it takes, which is why a container start stays fast.
"""

from __future__ import annotations

import os

from ponytail.capabilities import CAPABILITIES, CONTROL_NODES, MPS_PIPE_DIRECTORY, FeatureAsk
from ponytail.config import Config
from ponytail.errors import ProbeError
from ponytail.host.driver import (
    GpuInformation,
    LostGpu,
    nvidia_major,
    read_char_majors,
    read_driver_version,
    read_gpu_informations,
    read_proc_files,
)
from ponytail.host.driver_search import library_mismatch, search_driver_files
from ponytail.host.features import feature_finding, ipc_path
from ponytail.host.mig import read_access_files, read_mig_devices
from ponytail.host.nodes import dri_nodes_of, mig_global_minors
from ponytail.host.pci import PciFunction, nvidia_gpus
from ponytail.host.records import NODE_MODULE_NOT_LOADED, DeviceNode, Gpu, Gpus, Host, IpcPath, char_node


def probe_gpus(config: Config, udev: bool = True, allow_lost: bool = False) -> Gpus:
    """Driver version and GPUs in PCI bus order (with MIG state), without touching any driver file.
    A GPU on the bus that the driver lost (no information file) is an inconsistent host: an
    error, or with ``allow_lost`` the other GPUs and why their indices cannot be trusted."""
    version = read_driver_version(config.proc_root)
    lost: list[LostGpu] = []
    infos = read_gpu_informations(config.proc_root, lost if allow_lost else None)
    notes = _check_consistent(config, infos, nvidia_gpus(config.sys_root, udev), lost if allow_lost else None)
    gpus: list[Gpu] = []
    for bus_id in sorted(infos):
        info = infos[bus_id]
        if info.excluded:
            notes.append(f"GPU {bus_id} is excluded by the driver (GPU Excluded: Yes); not offered")
            continue
        index = len(gpus)
        enabled, migs = read_mig_devices(config.proc_root, info.minor, index)
        gpus.append(Gpu(index, info.minor, bus_id, info.uuid, info.model, enabled, migs))
    information = {infos[g.pci_bus_id].proc_name: infos[g.pci_bus_id].text for g in gpus}
    return Gpus(version, tuple(gpus), tuple(notes), information, tuple(dict.fromkeys(lost)))


def _check_consistent(config: Config, infos: dict[str, GpuInformation], on_bus: list[PciFunction], lost: list[LostGpu] | None = None) -> list[str]:
    """A GPU's index is its place in bus order among the driver's GPUs: a GPU that the
    bus and the driver see differently would shift every index after it, and give a
    container another card than the one it asked for. So this is an error naming the
    GPU, except for a GPU another driver (vfio-pci, say) holds, and a sys root that
    shows no NVIDIA GPU at all (a /sys we cannot see). Minors must be distinct and below
    nvidia-modeset's 254 and nvidiactl's 255."""
    notes = []
    where = f"{config.proc_root}/driver/nvidia/gpus"
    bus_ids = {f.bus_id for f in on_bus}
    for function in on_bus:
        if function.bus_id in infos or (lost is not None and any(g.bus_id == function.bus_id for g in lost)):
            continue
        if function.driver and function.driver != "nvidia":
            notes.append(f"GPU {function.bus_id} is bound to the {function.driver} driver, not NVIDIA's; not offered")
            continue
        gone = LostGpu(function.bus_id, f"inconsistent host: GPU {function.bus_id} is on the PCI bus but not in {where} "
                                        "(the driver lost it, or its information file is missing)")
        if lost is None:
            raise ProbeError(gone.message)
        lost.append(gone)
    if on_bus:
        for bus_id in sorted(infos.keys() - bus_ids):
            raise ProbeError(
                f"inconsistent host: GPU {bus_id} is in {where} but not on the PCI bus under {config.sys_root}/bus/pci "
                "(fallen off the bus?); refusing to number the GPUs: check 'nvidia-smi' and dmesg"
            )
    elif infos:
        notes.append(f"no NVIDIA GPU found under {config.sys_root}/bus/pci: GPUs numbered from {where} alone")
    seen: dict[int, str] = {}
    for bus_id in sorted(infos):
        minor = infos[bus_id].minor
        if minor in seen:
            raise ProbeError(f"inconsistent host: GPUs {seen[minor]} and {bus_id} both have device minor {minor} in {where}")
        if minor >= min(m for module, m in CONTROL_NODES.values() if module == "nvidia"):
            raise ProbeError(
                f"inconsistent host: GPU {bus_id} has device minor {minor} in {where}, which belongs to a control device "
                "(254 nvidia-modeset, 255 nvidiactl)"
            )
        seen[minor] = bus_id
    return notes


def probe_host(
    config: Config, capabilities: tuple[str, ...], library_globs: tuple[str, ...] | None = None, udev: bool = True,
    library_version: str = "", features: tuple[FeatureAsk, ...] = (), allow_lost: bool = False,
) -> Host:
    """Everything a plan needs for ``capabilities``, read once. ``library_globs`` (from
    -libs) replaces the capabilities' libraries and the config's globs. ``library_version``
    (a registered driver tree's) filters libraries and firmware instead of the kernel module's."""
    found = probe_gpus(config, udev, allow_lost)
    files_version = library_version or found.driver_version
    majors = read_char_majors(config.proc_root)
    gpu_major = nvidia_major(majors)
    gpu_nodes = {g.minor: char_node(config.dev_root, f"nvidia{g.minor}", gpu_major, g.minor) for g in found.gpus}
    control = {}
    for name, (module, minor) in CONTROL_NODES.items():
        major = gpu_major if module == "nvidia" else majors.get(module)
        if major is None:
            missing = f"the {module} module is not loaded (no {module} in /proc/devices)"
            if module == "nvidia-uvm":
                missing += ": CUDA needs it; run 'nvidia-modprobe -u -c0' or 'modprobe nvidia-uvm'"
            control[name] = DeviceNode(name, os.path.join(config.dev_root, name), 0, minor, missing, NODE_MODULE_NOT_LOADED)
        else:
            control[name] = char_node(config.dev_root, name, major, minor)

    searched = search_driver_files(config, capabilities, library_globs, files_version)
    ipc: dict[str, IpcPath] = {}
    for cap in capabilities:
        for path in CAPABILITIES[cap].ipc:
            path = config.mps_pipe_directory if path == MPS_PIPE_DIRECTORY else path
            if path not in ipc:
                entry = ipc_path(config.ipc_root, path, cap)
                if entry is not None:
                    ipc[path] = entry
    return Host(
        driver_version=found.driver_version,
        gpus=found.gpus,
        gpu_nodes=gpu_nodes,
        control_nodes=control,
        caps_major=majors.get("nvidia-caps"),
        mig_global_minors=mig_global_minors(config.proc_root),
        libraries=searched.libraries,
        binaries=searched.binaries,
        files=searched.files,
        ipc=tuple(ipc.values()),
        reports=searched.reports,
        skipped=searched.skipped,
        notes=found.notes,
        proc_files=read_proc_files(config.proc_root),
        gpu_information=found.information,
        capability_files=read_access_files(config.proc_root, [(g.minor, m) for g in found.gpus for m in g.mig_devices]),
        dev_root=config.dev_root,
        features=tuple(feature_finding(config, majors, ask.name, ask.selector, ask.source, found.driver_version) for ask in features),
        dri_nodes=dri_nodes_of(config, found.gpus) if any(CAPABILITIES[c].dri_nodes for c in capabilities) else {},
        tree_root=config.driver_root if library_version else "", tree_version=library_version,
        lost=found.lost,
        mismatch=library_mismatch(config, capabilities, searched.libraries, library_version, found.driver_version),
    )
