"""Driver capabilities (NVIDIA_DRIVER_CAPABILITIES): which files, binaries, nodes and
sockets each one brings into the container. Plain data, as NVIDIA's container stack
defines them, so images built for it work unchanged.
"""

from __future__ import annotations

from ponytail.lite.records import record

DRIVER_CAPABILITIES_VAR = "NVIDIA_DRIVER_CAPABILITIES"
ALL = ("compute", "compat32", "graphics", "utility", "video", "display", "ngx")
DEFAULT = ("utility", "compute")
NVIDIA_MAJOR = 195  # the GPUs' major where /proc/devices names none (ponytail.host.driver.nvidia_major)
# Every control device node (beyond the GPUs' /dev/nvidiaN and the MIG access nodes), by its name
# under /dev: the /proc/devices name of its major and its minor. The host probe looks at each, and
# a capability's ``nodes`` name them from here.
CONTROL_NODES: dict[str, tuple[str, int]] = {
    "nvidiactl": ("nvidia", 255),
    "nvidia-modeset": ("nvidia", 254),
    "nvidia-uvm": ("nvidia-uvm", 0),
    "nvidia-uvm-tools": ("nvidia-uvm", 1),
}
MPS_PIPE_DIRECTORY = "/tmp/nvidia-mps"  # noqa: S108 - MPS's default pipe directory on the host, bound from there, not a file made here
DRM_MAJOR = 226  # /dev/dri/card* and renderD*: the kernel's DRM major, whichever driver


@record(frozen=True)
class Capability:
    libraries: tuple[str, ...] = ()  # library names without ".so.<version>"
    binaries: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()  # control nodes beyond nvidiactl and the GPUs' own (keys of CONTROL_NODES)
    files: tuple[str, ...] = ()  # other driver files (ICD/JSON), globs under the driver root
    ipc: tuple[str, ...] = ()  # daemons' sockets and pipe directories on the host
    implies: tuple[str, ...] = ()
    # what the capability cannot work without: a start that asks for it fails when one
    # is missing (or the wrong node); everything else it brings is optional (a warning)
    required_libraries: tuple[str, ...] = ()  # SONAMEs
    required_nodes: tuple[str, ...] = ()
    dri_nodes: bool = False  # the selected GPUs' /dev/dri/card* and renderD* (found through sysfs)


CAPABILITIES: dict[str, Capability] = {
    "utility": Capability(
        libraries=("libnvidia-ml", "libnvidia-cfg", "libnvidia-nscq"),
        binaries=(
            "nvidia-smi", "nvidia-debugdump", "nvidia-persistenced",
            "nv-fabricmanager", "nvidia-imex", "nvidia-imex-ctl",  # multi-node: fabric manager and IMEX, to query them
        ),
        ipc=("/run/nvidia-persistenced/socket", "/run/nvidia-fabricmanager/socket"),
        required_libraries=("libnvidia-ml.so.1",),
    ),
    "compute": Capability(
        libraries=(
            "libcuda", "libcudadebugger", "libnvidia-opencl", "libnvidia-gpucomp", "libnvidia-ptxjitcompiler",
            "libnvidia-fatbinaryloader", "libnvidia-allocator", "libnvidia-compiler", "libnvidia-pkcs11",
            "libnvidia-pkcs11-openssl3", "libnvidia-nvvm", "libnvidia-nvvm70", "libnvidia-tileiras",
        ),
        binaries=("nvidia-cuda-mps-control", "nvidia-cuda-mps-server"),
        nodes=("nvidia-uvm", "nvidia-uvm-tools"),
        files=("/etc/OpenCL/vendors/nvidia.icd",),
        ipc=("/run/nvidia-persistenced/socket", "/run/nvidia-fabricmanager/socket", MPS_PIPE_DIRECTORY),
        required_libraries=("libcuda.so.1",),
        required_nodes=("nvidia-uvm",),
    ),
    "video": Capability(
        libraries=("libvdpau_nvidia", "libnvidia-encode", "libnvidia-opticalflow", "libnvcuvid"),
        implies=("compute",),
    ),
    "graphics": Capability(
        libraries=(
            "libnvidia-eglcore", "libnvidia-glcore", "libnvidia-tls", "libnvidia-glsi", "libnvidia-fbc",
            "libnvidia-ifr", "libnvidia-rtcore", "libnvoptix", "libGLX_nvidia", "libEGL_nvidia",
            "libGLESv2_nvidia", "libGLESv1_CM_nvidia", "libnvidia-glvkspirv", "libnvidia-egl-wayland",
            "libnvidia-egl-gbm", "libnvidia-egl-wayland2", "libnvidia-egl-xcb", "libnvidia-egl-xlib",
            "libnvidia-vulkan-producer", "libnvidia-cbl",
        ),
        files=(
            "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
            "/usr/share/vulkan/icd.d/nvidia_icd.json",
            "/etc/vulkan/icd.d/nvidia_icd.json",
            "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
            "/etc/vulkan/implicit_layer.d/nvidia_layers.json",
            "/usr/share/egl/egl_external_platform.d/*nvidia*.json",
            # {machine} and {version} are the machine (os.uname) and the driver's version (ponytail.host.driver_search)
            "/usr/share/vulkan/icd.d/nvidia_icd.{machine}.json",
            "/etc/vulkan/icd.d/nvidia_icd.{machine}.json",
            "/usr/share/nvidia/nvoptix.bin",  # OptiX's precompiled kernels, read by libnvoptix
        ),
        dri_nodes=True,
    ),
    "display": Capability(
        nodes=("nvidia-modeset",),
        required_nodes=("nvidia-modeset",),
        files=(  # the Xorg driver and GLX server module (loaded by Xorg: mounted without noexec), xorg.conf.d snippets
            "/usr/lib/xorg/modules/drivers/nvidia_drv.so",
            "/usr/lib64/xorg/modules/drivers/nvidia_drv.so",
            # Xorg loads the GLX module by its plain name: NVIDIA's installer links it to the
            # versioned file (one mount, at the plain name), Debian ships the plain file alone
            "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so",
            "/usr/lib64/xorg/modules/extensions/libglxserver_nvidia.so",
            "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.{version}",
            "/usr/lib64/xorg/modules/extensions/libglxserver_nvidia.so.{version}",
            "/usr/share/X11/xorg.conf.d/*nvidia*.conf",
            "/etc/X11/xorg.conf.d/*nvidia*.conf",
        ),
        dri_nodes=True,
    ),
    "ngx": Capability(libraries=("libnvidia-ngx",)),
    "compat32": Capability(),  # 32-bit copies of the other requested capabilities' libraries
}


def parse_capabilities(text: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(capabilities, unknown names) from a NVIDIA_DRIVER_CAPABILITIES value.

    Unset or empty means the default (utility, compute); ``all`` means every one;
    ``video`` brings ``compute`` with it. Unknown names are returned: an error on an
    operator's command line (build_request), a warning in a container's env.
    """
    if text is None or not text.strip():
        names = list(DEFAULT)
    else:
        names = [n.strip().lower() for n in text.split(",") if n.strip()]
    unknown = tuple(n for n in names if n not in CAPABILITIES and n != "all")
    if "all" in names:
        return ALL, unknown
    chosen: list[str] = []
    for name in names:
        for n in (name, *CAPABILITIES[name].implies) if name in CAPABILITIES else ():
            if n not in chosen:
                chosen.append(n)
    return tuple(c for c in ALL if c in chosen), unknown


# Opt-in features beyond the capabilities (multi-node training): what each brings, asked by its
# variable (``enabled``), by the device plugin's CDI annotation (``nvidia.com/<name>=all``), and
# for IMEX channels by a list (``all`` or channel numbers). Never part of ``all`` capabilities.
@record(frozen=True)
class Feature:
    variable: str
    what: str
    # device nodes: (name under /dev, whether a number follows it, /proc/devices name of its major);
    # each must exist at least once and be a character device of that major
    nodes: tuple[tuple[str, bool, str], ...]
    files: tuple[str, ...] = ()  # host files, under the driver root, mounted read-only when present
    # host directories, under the IPC root, mounted read-only when present and when they hold no socket or
    # FIFO (a host daemon's channel): the data a feature's library reads, never a daemon's directory
    directories: tuple[str, ...] = ()
    hint: str = ""  # what to do when a node is missing
    daemon: str = ""  # the host's service the feature needs, when installed: it must be of the running driver


class FeatureAsk(tuple[str, str, str]):
    """One opt-in feature a container asks for: ``name`` (a key of FEATURES), ``selector`` (``all``, or
    IMEX channel numbers ``0,1``) and ``source`` (who asked: ``NVIDIA_GDS=enabled``, the device
    plugin's mounts or annotations). A tuple (name, selector, source), so it unpacks and compares
    as one; a record's fields by name."""

    __slots__ = ()

    def __new__(cls, name: str, selector: str, source: str) -> FeatureAsk:
        return tuple.__new__(cls, (name, selector, source))

    @property
    def name(self) -> str:
        return self[0]

    @property
    def selector(self) -> str:
        return self[1]

    @property
    def source(self) -> str:
        return self[2]


IMEX_FEATURE = "imex-channel"
IMEX_CHANNEL_DIR = "nvidia-caps-imex-channels"  # under /dev: channel<N>, minor N
FEATURES: dict[str, Feature] = {
    IMEX_FEATURE: Feature(
        "NVIDIA_IMEX_CHANNELS", "IMEX channel", ((f"{IMEX_CHANNEL_DIR}/channel", True, IMEX_CHANNEL_DIR),),
        hint="create it with 'nvidia-modprobe -i <N>', or check the nvidia module's NVreg_CreateImexChannel0",
        daemon="nvidia-imex",
    ),
    "gds": Feature(
        "NVIDIA_GDS", "GPUDirect Storage", (("nvidia-fs", True, "nvidia-fs"),),
        files=("/etc/cufile.json",), directories=("/run/udev/data",),  # the udev database cuFile reads, not udevd's control socket hint="load the nvidia-fs module (modprobe nvidia-fs)",
    ),
    "mofed": Feature(
        "NVIDIA_MOFED", "InfiniBand/RDMA (MOFED)",
        (("infiniband/uverbs", True, "infiniband_verbs"), ("infiniband/rdma_cm", False, "misc")),
        hint="load ib_uverbs and rdma_ucm (modprobe ib_uverbs rdma_ucm)",
    ),
    "gdrcopy": Feature("NVIDIA_GDRCOPY", "GDRCopy", (("gdrdrv", False, "gdrdrv"),), hint="load the gdrdrv module"),
    "nvswitch": Feature(
        "NVIDIA_NVSWITCH", "NVSwitch",
        (("nvidia-nvswitchctl", False, "nvidia-nvswitch"), ("nvidia-nvswitch", True, "nvidia-nvswitch")),
        hint="load the nvidia module on an NVSwitch system, or run 'nvidia-modprobe -s'",
        daemon="nv-fabricmanager",
    ),
}
