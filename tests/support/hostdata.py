"""Host data for the pure core's unit tests, built directly as the probe's plain records
(Gpu, DeviceNode, Host, DriverFile, ...): no root, no files, no fake filesystem.

The shape follows the fake hosts of fakehost.py: driver 550.54.15, GPUs on PCI buses 0x18,
0x28, ... with minors that need not follow bus order, libcuda and libnvidia-ml under
/usr/lib/x86_64-linux-gnu, nvidia-smi, and the control nodes of capabilities.CONTROL_NODES.
"""

from __future__ import annotations

from ponytail.capabilities import CONTROL_NODES
from ponytail.container.request import DeviceRequest, Request, build_request
from ponytail.host.driver_files import DriverFile, SearchReport
from ponytail.host.mig import MigDevice
from ponytail.host.records import DeviceNode, Gpu, Host, IpcPath
from ponytail.lite.records import field, record
from ponytail.plan.operations import Plan, build_plan
from ponytail.plan.select import Selection, select_devices

DRIVER = "550.54.15"
LIB_DIR = "/usr/lib/x86_64-linux-gnu"
LIB32_DIR = "/usr/lib/i386-linux-gnu"
DEV = "/host/dev"  # the dev root the host paths of nodes lie under
MAJORS = {"nvidia": 195, "nvidia-uvm": 511, "nvidia-caps": 508}
LDCONFIG = "/sbin/ldconfig"
PARAMS = b"ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nEnableMSI: 1\n"
VERSION_FILE = f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {DRIVER}\n".encode()


def bus_id(index: int) -> str:
    return f"0000:{0x18 + 0x10 * index:02x}:00.0"


def uuid(index: int) -> str:
    return f"GPU-{index:08x}-1111-2222-3333-444455556666"


def gpu_list(
    count: int, minors: list[int] | None = None, model: str = "Tesla T4", mig: dict[int, list[tuple[int, int]]] | None = None
) -> tuple[Gpu, ...]:
    """``count`` GPUs in bus order; ``mig``: by GPU index, its (gi, ci) MIG devices. Each MIG
    device's access minors are distinct: gi_minor = 100 * (index + 1) + 10 * gi, ci_minor = that + 1 + ci."""
    minors = minors if minors is not None else list(range(count))
    gpus = []
    for i in range(count):
        devices = tuple(
            MigDevice(i, gi, ci, 100 * (i + 1) + 10 * gi, 100 * (i + 1) + 10 * gi + 1 + ci) for gi, ci in (mig or {}).get(i, [])
        )
        gpus.append(Gpu(i, minors[i], bus_id(i), uuid(i), model, bool(devices), devices))
    return tuple(gpus)


def node(name: str, major: int, minor: int, problem: str | None = None) -> DeviceNode:
    return DeviceNode(name, f"{DEV}/{name}", major, minor, problem)


def library(name: str, soname: str | None, bits: int = 64, directory: str = "") -> DriverFile:
    """A driver library found by a capability's search, mounted at the same path."""
    directory = directory or (LIB_DIR if bits == 64 else LIB32_DIR)
    path = f"{directory}/{name}"
    return DriverFile(path, f"/driver{path}", path, soname, f"{name.split('.so')[0]} (a capability)", bits)


LIBCUDA = library(f"libcuda.so.{DRIVER}", "libcuda.so.1")
LIBNVML = library(f"libnvidia-ml.so.{DRIVER}", "libnvidia-ml.so.1")
NVIDIA_SMI = DriverFile("/usr/bin/nvidia-smi", "/driver/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi", None, "utility", capability="utility")


@record(frozen=True)
class RecordedHost(Host):
    """A Host whose MIG access nodes are records too: Host.caps_node looks at the dev root
    (os.stat) when the plan asks for a node, which a unit test has no files for."""

    node_problems: dict[str, str] = field(default_factory=dict)

    def caps_node(self, minor: int) -> DeviceNode:
        name = f"nvidia-caps/nvidia-cap{minor}"
        if self.caps_major is None:
            return node(name, 0, minor, "no nvidia-caps in /proc/devices (MIG access nodes need it)")
        return node(name, self.caps_major, minor, self.node_problems.get(name))


def make_host(
    gpus: tuple[Gpu, ...] | None = None,
    libraries: tuple[DriverFile, ...] = (LIBCUDA, LIBNVML),
    binaries: tuple[DriverFile, ...] = (NVIDIA_SMI,),
    files: tuple[DriverFile, ...] = (),
    ipc: tuple[IpcPath, ...] = (),
    node_problems: dict[str, str] | None = None,
    caps_major: int | None = MAJORS["nvidia-caps"],
    mig_global_minors: dict[str, int] | None = None,
    reports: tuple[SearchReport, ...] | None = None,
    notes: tuple[str, ...] = (),
    proc_files: dict[str, bytes] | None = None,
) -> Host:
    """A probed host; ``node_problems``: by node name (``nvidia2``, ``nvidia-uvm``,
    ``nvidia-caps/nvidia-cap310``), what is wrong with it (the probe's words)."""
    gpus = gpus if gpus is not None else gpu_list(3, minors=[2, 0, 1])
    problems = node_problems or {}
    gpu_nodes = {g.minor: node(f"nvidia{g.minor}", MAJORS["nvidia"], g.minor, problems.get(f"nvidia{g.minor}")) for g in gpus}
    control = {name: node(name, MAJORS[kind], minor, problems.get(name)) for name, (kind, minor) in CONTROL_NODES.items()}
    if reports is None:
        reports = (
            SearchReport("libcuda.so.* (compute)", tuple(lib.path for lib in libraries if "libcuda" in lib.path)),
            SearchReport("libnvidia-ml.so.* (utility)", tuple(lib.path for lib in libraries if "libnvidia-ml" in lib.path)),
        )
    return RecordedHost(
        driver_version=DRIVER,
        gpus=gpus,
        gpu_nodes=gpu_nodes,
        control_nodes=control,
        caps_major=caps_major,
        mig_global_minors=mig_global_minors if mig_global_minors is not None else {"config": 1, "monitor": 2},
        libraries=libraries,
        binaries=binaries,
        files=files,
        ipc=ipc,
        reports=reports,
        skipped=(),
        notes=notes,
        proc_files=proc_files if proc_files is not None else {"params": PARAMS, "version": VERSION_FILE},
        gpu_information={g.pci_bus_id: f"Model: \t\t {g.model}\nBus Location: \t {g.pci_bus_id}\n".encode() for g in gpus},
        capability_files={
            f"capabilities/gpu{g.minor}/mig/gi{m.gi}/{part}": f"DeviceFileMinor: {minor}\n".encode()
            for g in gpus
            for m in g.mig_devices
            for part, minor in (("access", m.gi_minor), (f"ci{m.ci}/access", m.ci_minor))
        },
        dev_root=DEV,
        node_problems=problems,
    )


def selection(host: Host, selector: str) -> Selection:
    """What ``NVIDIA_VISIBLE_DEVICES=selector`` selects on ``host``."""
    return select_devices(host.gpus, DeviceRequest(selector, "NVIDIA_VISIBLE_DEVICES"))


def env_request(env: dict[str, str], privileged: bool = True) -> Request:
    """What a container with ``env`` asks for."""
    return build_request(env=env, privileged=privileged)


MIG_GPUS = gpu_list(3, minors=[2, 0, 1], mig={2: [(1, 0), (2, 0)]})  # GPU 2 (/dev/nvidia1) has MIG devices 2:1:0, 2:2:0


def plan_for(
    selector: str = "0", capabilities: str = "utility,compute", host: Host | None = None,
    mig_gpus: dict[str, tuple[Gpu, ...]] | None = None, ldconfig: str | None = LDCONFIG, nodes_only: bool = False,
) -> Plan:
    """The plan for a container with NVIDIA_VISIBLE_DEVICES=selector and
    NVIDIA_DRIVER_CAPABILITIES=capabilities on ``host`` (by default 3 GPUs, minors [2, 0, 1])."""
    host = host if host is not None else make_host()
    request = env_request({"NVIDIA_VISIBLE_DEVICES": selector, "NVIDIA_DRIVER_CAPABILITIES": capabilities})
    return build_plan(host, request, selection(host, selector), mig_gpus or {}, ldconfig, nodes_only=nodes_only)
