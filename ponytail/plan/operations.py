"""Host + request -> Plan: every operation, in order, with the reason it is there.

Pure: no I/O. The executor applies a Plan; ``-debug`` prints the same Plan and
``ponytail list`` prints its host paths.
"""

from __future__ import annotations

import os

from ponytail.lite.records import field, record

TYPE_CHECKING = False
if TYPE_CHECKING:  # the operations need none of these at run time (a CDI hook loads no probe)
    from ponytail.container.request import Request
    from ponytail.host.driver_files import SkippedFile
    from ponytail.host.records import DeviceNode, FeatureFinding, Gpu, Host
    from ponytail.plan.select import Selection

LD_CONF_FILE = "/etc/ld.so.conf.d/00-ponytail.conf"
PROC_DRIVER_DIR = "/proc/driver/nvidia"
# Each kind of mount with its mount options (the kernel's MOUNT_ATTR_RDONLY, _NOSUID, _NODEV,
# _NOEXEC): the executor sets exactly these, -debug prints them, a CDI spec lists them.
MOUNT_OPTIONS: dict[str, tuple[str, ...]] = {
    "device": ("nosuid", "noexec"),
    "library": ("ro", "nosuid", "nodev"),
    "binary": ("ro", "nosuid", "nodev"),
    "file": ("ro", "nosuid", "nodev", "noexec"),
    "ipc": ("nosuid", "nodev", "noexec"),
}


@record(frozen=True)
class Mount:
    """Bind-mount a host file (or a daemon's pipe directory) onto ``target`` inside the rootfs."""

    kind: str  # "device", "library", "binary", "file", "ipc" (a key of MOUNT_OPTIONS)
    source: str
    target: str
    options: tuple[str, ...]  # the mount's attributes: "ro", "nosuid", "nodev", "noexec"
    reason: str
    rdev: tuple[int, int] | None = None  # for device nodes: the major:minor the source must have
    is_dir: bool = False
    identity: tuple[int, ...] | None = None  # for libraries: the file checked (device, inode, size, mtime ns), which the attached one must be


@record(frozen=True)
class Symlink:
    """Create ``target`` -> ``link_to`` inside the rootfs (a SONAME link). Should the image
    have a regular file there (its own copy of the library), ``library`` is mounted over it, or,
    with ``replace_file``, the file is removed for the link."""

    target: str
    link_to: str
    reason: str
    library: str = ""  # host path of the library the link names
    replace_file: bool = False  # a regular file of the image there is replaced by the link (NVIDIA's create-symlinks)


@record(frozen=True)
class ProcMask:
    """A read-only tmpfs over the container's /proc/driver/nvidia holding only what it may
    see: params with ModifyDeviceFiles: 0 (so no library in the container tries to create
    device nodes), version, registry, and the selected GPUs' information files."""

    target: str
    files: tuple[tuple[str, bytes], ...]  # relative path -> content
    reason: str


@record(frozen=True)
class HideNode:
    """Make the container's own ``target`` unusable inside it: a privileged container gets every
    host device in its /dev from the engine; this one is a GPU it was not allotted. The node is
    bind-mounted onto itself with ``nodev`` in the container's mount namespace, so opening it
    fails with EACCES; the host's /dev is never touched. (A privileged container may unmount it
    again: this keeps a pod from using GPUs by mistake, it does not confine it.)"""

    target: str
    rdev: tuple[int, int]
    reason: str


@record(frozen=True)
class LinkerCache:
    """Add ``directories`` to the rootfs's linker config, then run the host's ldconfig on it,
    with those directories first so the injected driver wins over copies in the image."""

    conf_file: str
    directories: tuple[str, ...]
    ldconfig: str
    sonames: tuple[tuple[str, str], ...]  # (SONAME, path the cache must give it) to check after
    reason: str


@record(frozen=True)
class AllowDevices:
    """Allow the container to read and write these character devices, in hook mode: on
    cgroup v1 in its devices.allow, on cgroup v2 in each eBPF device program attached to its
    cgroup (``ponytail.plan.devicefilter`` builds the block of instructions from ``devices``)."""

    devices: tuple[tuple[int, int], ...]  # (major, minor) of every injected node
    reason: str
    nodes: tuple[str, ...] = ()  # their paths in the container, in the same order (for messages)

    @property
    def rules(self) -> tuple[str, ...]:
        return tuple(f"c {major}:{minor} rw" for major, minor in self.devices)


@record(frozen=True)
class WriteFile:
    """Write ``content`` to ``target`` inside the rootfs as a new file (a config file NVIDIA's hooks
    write: the driver's application profile, a linker-path file); never through what the image put
    there (ponytail.fs.rootfswriter)."""

    target: str
    content: bytes
    reason: str


@record(frozen=True)
class Chmod:
    """Set the permission bits of ``target`` inside the rootfs (NVIDIA's ``chmod`` hook): only the
    ordinary bits (no set-user-id, set-group-id or sticky bit), never through a symlink."""

    target: str
    mode: int
    reason: str


Operation = Mount | Symlink | ProcMask | LinkerCache | AllowDevices | HideNode | WriteFile | Chmod


@record(frozen=True)
class Plan:
    """Everything one run will do, as data: the operations in the order they are applied (device
    nodes, libraries and their links, binaries and files, the masked /proc, the linker cache, the
    device rules), each with its reason; the GPUs and MIG devices selected; what was skipped and
    why; warnings; and problems, any of which makes a real run refuse to start. The executor
    applies it (apply_plan), -debug prints it (render_plan), a CDI spec and a device program are
    made from it (plan/cdi.py, plan/devicefilter.py). Built by build_plan, from make_plan."""

    operations: tuple[Operation, ...]
    gpus: tuple[Gpu, ...]
    selection: Selection
    skipped: tuple[SkippedFile, ...]
    warnings: tuple[str, ...]
    problems: tuple[str, ...]  # a real run refuses to start when any are present
    choices: tuple[str, ...] = ()  # which driver tree and CUDA compat directory, and why (ponytail.host.driver_trees, ponytail.plan.compat)
    # warnings a run also says on stderr, not only in the log: what it injects will not work as it is
    said: tuple[str, ...] = ()

    def count(self, kind: str) -> int:
        return sum(1 for op in self.operations if isinstance(op, Mount) and op.kind == kind)

    def host_paths(self) -> list[str]:
        """Every host path a real run would inject, in plan order."""
        return [op.source for op in self.operations if isinstance(op, Mount)]


def build_plan(
    host: Host, request: Request, selection: Selection, mig_gpus: dict[str, tuple[Gpu, ...]], ldconfig: str | None,
    hide_other_gpus: bool = False, nodes_only: bool = False, named_libraries: bool = False,
) -> Plan:
    """Every operation that gives the container what ``request`` asks for on ``host``, family
    by family: device nodes, libraries with their SONAME links, binaries and files, the masked
    /proc/driver/nvidia, the linker cache, the device rules. Each family adds its operations,
    and the problems (a real run refuses) and warnings it finds.

    ``mig_gpus`` holds the GPUs named by NVIDIA_MIG_CONFIG_DEVICES / _MONITOR_DEVICES
    ("config", "monitor"), already resolved. ``hide_other_gpus`` (a privileged container under
    ``[request] isolate_privileged``): the GPU nodes not injected are hidden (HideNode).
    ``nodes_only``: the device nodes alone, with their problems and warnings (a CDI spec's device
    entry, ponytail.cdi.files: the libraries, files, masked /proc and linker cache are the
    shared plan's, and their problems are that plan's too, found with at least these capabilities).
    ``named_libraries``: the libraries were named by -libs, not the config (what a miss blames)."""
    plan = _Draft(warnings=list(host.notes))
    plan.warnings += [f"unknown driver capability {c!r} in {request.capabilities_source} ignored" for c in request.unknown_capabilities]
    caps = request.capabilities
    _device_nodes(plan, host, caps, selection, mig_gpus)
    if nodes_only:
        return Plan(tuple(plan.ops), _gpus(host, selection), selection, host.skipped, tuple(plan.warnings), tuple(plan.problems))
    if hide_other_gpus:
        _hide_other_gpus(plan, host)
    sonames = _libraries(plan, host, caps, named_libraries)
    said = _binaries_without_libraries(host, caps)
    plan.warnings += said
    for binary in host.binaries:
        plan.ops.append(_mount("binary", binary.host_path, binary.target, binary.found_by))
    for f in host.files:  # a shared object among them (Xorg's modules) is loaded by a program: not noexec
        plan.ops.append(_mount("library" if _is_shared_object(f.target) else "file", f.host_path, f.target, f.found_by))
    for ipc in host.ipc:
        plan.ops.append(_mount("ipc", ipc.host_path, ipc.target, f"{ipc.why}: driver daemon IPC", is_dir=ipc.is_dir))
    if caps and "params" in host.proc_files:
        plan.ops.append(_proc_mask(host, selection, mig_gpus))
    _linker_cache(plan, host, sonames, ldconfig)
    nodes = [op for op in plan.ops if isinstance(op, Mount) and op.rdev is not None]
    if nodes:
        rules = tuple(op.rdev for op in nodes if op.rdev is not None)
        plan.ops.append(AllowDevices(rules, "let the container open exactly the injected device nodes", tuple(op.target for op in nodes)))
    return Plan(tuple(plan.ops), _gpus(host, selection), selection, host.skipped, tuple(plan.warnings), tuple(plan.problems), said=tuple(said))


def _gpus(host: Host, selection: Selection) -> tuple[Gpu, ...]:
    """The GPUs ``selection`` gives the container, whole or by a MIG device of theirs."""
    by_index = {g.index: g for g in host.gpus}
    return tuple(dict.fromkeys(selection.gpus + tuple(by_index[m.gpu_index] for m in selection.migs)))


@record
class _Draft:
    """A plan being built: its operations so far, and what was found wrong on the way."""

    ops: list[Operation] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _device_nodes(
    plan: _Draft, host: Host, caps: tuple[str, ...], selection: Selection, mig_gpus: dict[str, tuple[Gpu, ...]]
) -> None:
    """A device mount per node: the selected GPUs (and MIG devices' parents and access nodes),
    MIG config/monitor access, the control node and each capability's nodes."""
    from ponytail.capabilities import CAPABILITIES  # not on the CDI hook's path, which reads the plan's records only

    nodes: dict[str, tuple[DeviceNode, str, bool]] = {}  # name -> (node, why, fatal)
    by_index = {g.index: g for g in host.gpus}
    for gpu in selection.gpus:
        nodes[f"nvidia{gpu.minor}"] = (host.gpu_nodes[gpu.minor], _gpu_why(gpu), True)
    for mig in selection.migs:
        parent = by_index[mig.gpu_index]
        nodes.setdefault(f"nvidia{parent.minor}", (host.gpu_nodes[parent.minor], f"parent of MIG device {mig.name}", True))
        nodes[f"cap{mig.gi_minor}"] = (host.caps_node(mig.gi_minor), f"MIG device {mig.name}: GPU instance {mig.gi} access", True)
        nodes[f"cap{mig.ci_minor}"] = (host.caps_node(mig.ci_minor), f"MIG device {mig.name}: compute instance {mig.ci} access", True)
    for what, gpus in mig_gpus.items():
        minor = host.mig_global_minors.get(what)
        if minor is None:
            plan.problems.append(f"MIG {what} access requested but {what} has no DeviceFileMinor under /proc/driver/nvidia/capabilities/mig")
            continue
        nodes[f"mig-{what}"] = (host.caps_node(minor), f"MIG {what} access (privileged container)", True)
        for gpu in gpus:
            nodes.setdefault(f"nvidia{gpu.minor}", (host.gpu_nodes[gpu.minor], f"{_gpu_why(gpu)}, for MIG {what}", True))
    nodes["nvidiactl"] = (host.control_nodes["nvidiactl"], "control device", True)
    for cap in caps:
        for name in CAPABILITIES[cap].nodes:
            nodes.setdefault(name, (host.control_nodes[name], cap, name in CAPABILITIES[cap].required_nodes))  # every one is in CONTROL_NODES
    for node, why, fatal in nodes.values():
        if node.problem is None:
            plan.ops.append(_mount("device", node.host_path, f"/dev/{node.name}", why, (node.major, node.minor)))
        elif fatal:
            plan.problems.append(f"{why}: {node.problem}")
        else:
            plan.warnings.append(f"/dev/{node.name} not injected: {node.problem}")
    dri_caps = "/".join(c for c in caps if CAPABILITIES[c].dri_nodes)
    if dri_caps:
        _dri_nodes(plan, host, selection.gpus, dri_caps)
    _features(plan, host)


def _features(plan: _Draft, host: Host) -> None:
    """The opt-in features asked for (NVIDIA_IMEX_CHANNELS, NVIDIA_GDS, ...): every node found,
    its files and directories read-only; a feature the host cannot give is a problem (never a
    partial start)."""
    for feature in host.features:
        plan.problems += feature.problems
        plan.ops += feature_mounts(feature)


def feature_mounts(feature: FeatureFinding) -> list[Mount]:
    """A found feature's nodes as device mounts, its files and directories read-only."""
    nodes = [_mount("device", n.host_path, f"/dev/{n.name}", feature.why, (n.major, n.minor)) for n in feature.nodes]
    return nodes + [_mount("file", p.host_path, p.target, p.why, is_dir=p.is_dir) for p in feature.paths]


def _dri_nodes(plan: _Draft, host: Host, gpus: tuple[Gpu, ...], why: str) -> None:
    """The selected GPUs' /dev/dri nodes (the probe found them from each GPU's PCI address), with
    the /dev/dri/by-path links udev would make. A GPU with no DRM device (nvidia-drm not loaded)
    is a warning; a node sysfs names that is missing or not that device is a problem."""
    for gpu in gpus:
        nodes = host.dri_nodes.get(gpu.pci_bus_id)
        if nodes is None:
            plan.warnings.append(
                f"{why}: {_gpu_why(gpu)} has no DRM device in sysfs (nvidia-drm not loaded? 'modprobe nvidia-drm'): "
                "no /dev/dri nodes injected for it"
            )
            continue
        for node in nodes:
            reason = f"{why}: DRI node of {_gpu_why(gpu)}"
            if node.problem is not None:
                plan.problems.append(f"{reason}: {node.problem}")
                continue
            plan.ops.append(_mount("device", node.host_path, f"/dev/{node.name}", reason, (node.major, node.minor)))
            name = os.path.basename(node.name)
            link = f"/dev/dri/by-path/pci-{gpu.pci_bus_id}-{'card' if name.startswith('card') else 'render'}"
            plan.ops.append(Symlink(link, f"../{name}", f"{why}: by-path link of {_gpu_why(gpu)}"))


def _hide_other_gpus(plan: _Draft, host: Host) -> None:
    """A HideNode for each of the host's GPU nodes, and each MIG access node (nvidia-caps), that
    is not injected: a privileged container has them all in its /dev."""
    injected = {op.rdev for op in plan.ops if isinstance(op, Mount) and op.rdev is not None}
    why = " not allotted: hidden from a privileged container ([request] isolate_privileged)"
    by_minor = {g.minor: g for g in host.gpus}
    for minor, node in sorted(host.gpu_nodes.items()):
        if (node.major, node.minor) not in injected:
            gpu = by_minor.get(minor)
            plan.ops.append(HideNode(f"/dev/{node.name}", (node.major, node.minor), (_gpu_why(gpu) if gpu else f"GPU node {node.name}") + why))
    if host.caps_major is None:
        return
    caps: dict[int, str] = {minor: f"MIG {what} access" for what, minor in host.mig_global_minors.items()}
    for gpu in host.gpus:
        for mig in gpu.mig_devices:
            caps.setdefault(mig.gi_minor, f"MIG device {mig.name}: GPU instance {mig.gi} access")
            caps[mig.ci_minor] = f"MIG device {mig.name}: compute instance {mig.ci} access"
    for minor, what in sorted(caps.items()):
        if (host.caps_major, minor) not in injected:
            plan.ops.append(HideNode(f"/dev/nvidia-caps/nvidia-cap{minor}", (host.caps_major, minor), what + why))


def _libraries(plan: _Draft, host: Host, caps: tuple[str, ...], named: bool = False) -> dict[str, str]:
    """A library mount per driver library, then one SONAME link per SONAME that is not a
    library's own name; returns where each SONAME will be ("soname:bits" -> path)."""
    missing = _missing_libraries(host, caps)
    if host.mismatch and (missing or (not host.libraries and host.reports)):
        plan.problems.append(host.mismatch)  # the one diagnosis of an upgrade without a reboot (as ponytail check says it)
        missing = []
    elif not host.libraries and host.reports:
        searched = ", ".join(r.search for r in host.reports[:4]) + (", ..." if len(host.reports) > 4 else "")
        if named:
            fix = "check -libs: each is a path or glob under the driver root, matching the driver's libraries"
        else:
            fix = "reinstall the tree" if host.tree_root else "set [host] driver_root, or [library] paths, in the config"
        plan.problems.append(
            f"no library of {_tree(host) or f'driver {host.driver_version}'} found (searched {searched}, and its ld.so.cache): {fix}"
        )
    plan.problems += missing
    links: dict[str, Symlink] = {}
    sonames: dict[str, str] = {}
    for lib in host.libraries:
        plan.ops.append(_mount("library", lib.host_path, lib.target, f"{lib.found_by}{', 32-bit' if lib.bits == 32 else ''}"))
        directory, name = os.path.split(lib.target)
        if lib.soname:
            sonames.setdefault(f"{lib.soname}:{lib.bits}", f"{directory}/{lib.soname}")
        if lib.soname and lib.soname != name:
            link = f"{directory}/{lib.soname}"
            links.setdefault(link, Symlink(link, name, f"SONAME of {name}", lib.host_path))
    plan.ops.extend(links.values())
    return sonames


def _linker_cache(plan: _Draft, host: Host, sonames: dict[str, str], ldconfig: str | None) -> None:
    """The injected libraries' directories in the linker config and the host's ldconfig run on
    it, with the 64-bit SONAMEs the new cache must resolve to the injected files."""
    if not host.libraries:
        return
    directories = tuple(sorted({os.path.dirname(lib.target) for lib in host.libraries}))
    if ldconfig is None:
        plan.problems.append("no ldconfig on the host (looked in /sbin and /usr/sbin): set [host] ldconfig in the config")
        return
    checks = tuple(sorted((key.split(":")[0], path) for key, path in sonames.items() if key.endswith(":64")))
    plan.ops.append(LinkerCache(LD_CONF_FILE, directories, ldconfig, checks, "make the driver's libraries loadable by SONAME"))


def _missing_libraries(host: Host, caps: tuple[str, ...]) -> list[str]:
    """The libraries a requested capability cannot work without, searched for and not found
    (with -libs, only those its globs were meant to find)."""
    if not host.libraries:
        return []  # reported once, as no library at all
    from ponytail.capabilities import CAPABILITIES

    missing = []
    for cap in caps:
        for soname in CAPABILITIES[cap].required_libraries:
            stem = soname.split(".so")[0]
            if host.library(soname) is None and any(stem in r.search for r in host.reports):
                where = f"{_tree(host)} has none" if host.tree_root else \
                    f"the driver root ([host] driver_root) has none of driver {host.driver_version}"
                missing.append(
                    f"{cap} needs {soname}, and {where}: reinstall the driver's libraries, or leave {cap} out of NVIDIA_DRIVER_CAPABILITIES"
                )
    return missing

def _tree(host: Host) -> str:
    """The registered driver tree the host's files come from, in words; "" for the driver root."""
    return f"the driver tree at {host.tree_root}, version {host.tree_version}," if host.tree_root else ""


def _binaries_without_libraries(host: Host, caps: tuple[str, ...]) -> list[str]:
    """A binary injected for a capability whose required library is not (``-libs`` names exactly
    the libraries, while the capabilities still bring their binaries): nvidia-smi without
    libnvidia-ml.so.1 fails in the container. A library the capability's own search missed
    is a problem already (``_missing_libraries``)."""
    if not host.libraries:
        return []  # reported once, as no library at all
    from ponytail.capabilities import CAPABILITIES

    lacking = []
    for cap in caps:
        binaries = [os.path.basename(b.target) for b in host.binaries if b.capability == cap]
        for soname in CAPABILITIES[cap].required_libraries if binaries else ():
            stem = soname.split(".so")[0]
            if host.library(soname) is None and not any(stem in r.search for r in host.reports):
                lacking.append(
                    f"{', '.join(binaries)} injected for {cap}, but {soname}, which {cap} needs, is not (-libs left it "
                    f"out): add its glob to -libs (e.g. {os.path.dirname(host.libraries[0].path)}/{stem}.so.*), "
                    f"or leave {cap} out of -capabilities"
                )
    return lacking


def _is_shared_object(path: str) -> bool:
    name = os.path.basename(path)
    return name.endswith(".so") or ".so." in name


def _mount(kind: str, source: str, target: str, reason: str, rdev: tuple[int, int] | None = None, is_dir: bool = False) -> Mount:
    return Mount(kind, source, target, MOUNT_OPTIONS[kind], reason, rdev, is_dir)


def _gpu_why(gpu: Gpu) -> str:
    return f"GPU {gpu.index} {gpu.pci_bus_id} {gpu.model}"


def _proc_mask(host: Host, selection: Selection, mig_gpus: dict[str, tuple[Gpu, ...]]) -> ProcMask:
    from ponytail.host.mig import mig_access_path

    by_index = {g.index: g for g in host.gpus}
    visible = {g.pci_bus_id for g in selection.gpus} | {by_index[m.gpu_index].pci_bus_id for m in selection.migs}
    visible |= {g.pci_bus_id for gpus in mig_gpus.values() for g in gpus}
    # what CUDA in the container reads to learn which MIG instances it may use
    access = [p for m in selection.migs for p in mig_access_path(by_index[m.gpu_index].minor, m)]
    access += [f"capabilities/mig/{what}" for what in mig_gpus]
    return proc_mask(host.proc_files, host.gpu_information, host.capability_files, visible, access)


def proc_mask(
    proc_files: dict[str, bytes], gpu_information: dict[str, bytes], capability_files: dict[str, bytes],
    visible: set[str], access: list[str],
) -> ProcMask:
    """The masked /proc/driver/nvidia that shows the GPUs of the bus ids ``visible`` and the MIG
    access files ``access`` (paths relative to /proc/driver/nvidia), from the host's files."""
    params = _no_device_file_changes(proc_files["params"])
    files = [("params", params)] + [(n, proc_files[n]) for n in ("version", "registry") if n in proc_files]
    from ponytail.host.driver import canonical_bus_id

    for name, info in sorted(gpu_information.items()):
        if canonical_bus_id(name) in visible:
            files.append((f"gpus/{name}/information", info))
    files += [(p, capability_files[p]) for p in dict.fromkeys(access) if p in capability_files]
    return ProcMask(PROC_DRIVER_DIR, tuple(files), "hide other GPUs; ModifyDeviceFiles: 0")


def _no_device_file_changes(params: bytes) -> bytes:
    """The driver's params with ``ModifyDeviceFiles: 0`` (no regex: a hook does not import ``re``, tests/integration/test_hook_imports.py)."""
    lines = params.split(b"\n")
    for i, line in enumerate(lines):
        key, colon, value = line.partition(b":")
        if colon and key.strip() == b"ModifyDeviceFiles":
            lines[i] = key + colon + value[: len(value) - len(value.lstrip())] + b"0"
    return b"\n".join(lines)
