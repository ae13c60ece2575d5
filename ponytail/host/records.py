"""The host's plain records, as the probe reports them and the plan reads them: a device node, a
daemon's socket, an opt-in feature's finding, a GPU, the GPUs, the Host. Every module of host/ that
makes or reads one imports it from here, so none of them imports the probe that assembles them.

One read is here too: ``char_node``, a node as the dev root has it, which ``Host.caps_node`` needs
when the plan asks for a MIG access node."""

from __future__ import annotations

import os
import stat

from ponytail.lite.records import field, record

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported on the hook's path: for type checkers only
    from ponytail.host.driver import LostGpu
    from ponytail.host.driver_files import DriverFile, SearchReport, SkippedFile
    from ponytail.host.mig import MigDevice


@record(frozen=True)
class DeviceNode:
    """A character device under the host's dev root, and what it should be."""

    name: str  # relative to /dev, e.g. "nvidia0", "nvidia-uvm", "nvidia-caps/nvidia-cap12"
    host_path: str
    major: int
    minor: int
    problem: str | None  # None when the node exists and is the expected character device
    kind: str = ""  # the problem's kind, for code to decide on: NODE_MISSING, NODE_MODULE_NOT_LOADED, else ""


NODE_MISSING = "missing"  # no such file under the dev root
NODE_MODULE_NOT_LOADED = "module not loaded"  # its kernel module has no major in /proc/devices


def char_node(dev_root: str, name: str, major: int, minor: int) -> DeviceNode:
    path = os.path.join(dev_root, name)
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return DeviceNode(name, path, major, minor, f"{path} does not exist (create it with nvidia-modprobe, or check dev_root)", NODE_MISSING)
    except OSError as e:
        return DeviceNode(name, path, major, minor, f"cannot stat {path}: {e.strerror}")
    if not stat.S_ISCHR(st.st_mode):
        return DeviceNode(name, path, major, minor, f"{path} is not a character device")
    actual = (os.major(st.st_rdev), os.minor(st.st_rdev))
    if actual != (major, minor):
        return DeviceNode(name, path, major, minor, f"{path} is c {actual[0]}:{actual[1]}, expected c {major}:{minor}")
    return DeviceNode(name, path, major, minor, None)


@record(frozen=True)
class IpcPath:
    """A driver daemon's socket or pipe directory on the host, mounted at the same path."""

    host_path: str
    target: str
    is_dir: bool
    why: str


@record(frozen=True)
class FeatureFinding:
    """What the host has for one requested opt-in feature (ponytail.capabilities.FEATURES):
    its nodes (each checked), files and directories found, and why it cannot be given."""

    name: str
    why: str  # who asked, e.g. "NVIDIA_GDS=enabled: GPUDirect Storage"
    nodes: tuple[DeviceNode, ...]
    paths: tuple[IpcPath, ...]  # files (under the driver root) and directories (under the IPC root), read-only
    problems: tuple[str, ...]


@record(frozen=True)
class Gpu:
    """A GPU as users name it: ``index`` is its position in PCI bus order (nvidia-smi's),
    ``minor`` the N of /dev/nvidiaN, which the driver assigns and need not follow that order."""

    index: int
    minor: int
    pci_bus_id: str
    uuid: str
    model: str
    mig_enabled: bool = False
    mig_devices: tuple[MigDevice, ...] = ()


@record(frozen=True)
class Gpus:
    driver_version: str
    gpus: tuple[Gpu, ...]
    notes: tuple[str, ...]
    information: dict[str, bytes]  # directory name under gpus/ -> information file, offered GPUs only
    lost: tuple[LostGpu, ...] = ()  # GPUs the bus has and the driver lost (with allow_lost): why the indices cannot be trusted


@record(frozen=True)
class Host:
    """The host, probed once for one request (probe_host): the driver's version, its GPUs in bus
    order with their device nodes, the control nodes, the driver's libraries, binaries and files
    for the asked capabilities (and what was searched and skipped), the daemons' sockets, what
    /proc/driver/nvidia holds, the opt-in features' findings. Plain data; the plan is made from
    it and never reads the host itself."""

    driver_version: str
    gpus: tuple[Gpu, ...]
    gpu_nodes: dict[int, DeviceNode]  # by minor
    control_nodes: dict[str, DeviceNode]  # every node of capabilities.CONTROL_NODES
    caps_major: int | None
    mig_global_minors: dict[str, int]  # "config", "monitor" -> nvidia-caps minor
    libraries: tuple[DriverFile, ...]
    binaries: tuple[DriverFile, ...]
    files: tuple[DriverFile, ...]  # ICD/JSON files and firmware
    ipc: tuple[IpcPath, ...]
    reports: tuple[SearchReport, ...]
    skipped: tuple[SkippedFile, ...]
    notes: tuple[str, ...]
    proc_files: dict[str, bytes]  # /proc/driver/nvidia/{params,version,registry}
    gpu_information: dict[str, bytes]  # bus id -> /proc/driver/nvidia/gpus/<bus id>/information
    capability_files: dict[str, bytes]  # MIG access files, by path relative to /proc/driver/nvidia
    dev_root: str
    features: tuple[FeatureFinding, ...] = ()
    # by GPU bus id: its /dev/dri nodes (names "dri/card1", "dri/renderD128"), for capabilities with
    # dri_nodes; a GPU without a DRM device in sysfs (nvidia-drm not loaded) is absent
    dri_nodes: dict[str, tuple[DeviceNode, ...]] = field(default_factory=dict)
    tree_root: str = ""  # the registered driver tree the files come from ("": the host's driver root)
    tree_version: str = ""  # its version
    lost: tuple[LostGpu, ...] = ()  # Gpus.lost: GPUs may be named by UUID or bus id only
    mismatch: str = ""  # the driver root's libraries are another version than the kernel module (host.driver_files.version_mismatch)

    def caps_node(self, minor: int) -> DeviceNode:
        name = f"nvidia-caps/nvidia-cap{minor}"
        if self.caps_major is None:
            return DeviceNode(name, os.path.join(self.dev_root, name), 0, minor, "no nvidia-caps in /proc/devices (MIG access nodes need it)")
        return char_node(self.dev_root, name, self.caps_major, minor)

    def library(self, soname: str) -> DriverFile | None:
        return next((lib for lib in self.libraries if lib.soname == soname and lib.bits == 64), None)
