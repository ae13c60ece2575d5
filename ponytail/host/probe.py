"""Probe the host once: driver version, GPUs (and their MIG devices), device nodes,
driver files for the requested capabilities, daemons' sockets. Plain data out.

Never opens a GPU device node and never loads NVML: reading a few /proc and
/sys files is all it takes, which is why a container start stays fast.
"""

from __future__ import annotations

import os
import stat

from ponytail.capabilities import CAPABILITIES, CONTROL_NODES, DRM_MAJOR, FEATURES, IMEX_FEATURE, MPS_PIPE_DIRECTORY, Feature, FeatureAsk
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
from ponytail.host.driver_files import (
    BIN_DIRS,
    FILELIST,
    DriverFile,
    FoundFiles,
    LibrarySearch,
    SearchReport,
    SkippedFile,
    find_binary,
    find_files,
    find_libraries,
    host_path,
)
from ponytail.host.mig import MigDevice, caps_dir, read_access_files, read_access_minor, read_mig_devices
from ponytail.host.pci import PciFunction, nvidia_gpus
from ponytail.lite.records import field, record

LDCONFIG_CANDIDATES = ("/sbin/ldconfig", "/usr/sbin/ldconfig", "/sbin/ldconfig.real", "/usr/bin/ldconfig")


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
        return _node(self.dev_root, name, self.caps_major, minor)

    def library(self, soname: str) -> DriverFile | None:
        return next((lib for lib in self.libraries if lib.soname == soname and lib.bits == 64), None)


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
    gpu_nodes = {g.minor: _node(config.dev_root, f"nvidia{g.minor}", gpu_major, g.minor) for g in found.gpus}
    control = {}
    for name, (module, minor) in CONTROL_NODES.items():
        major = gpu_major if module == "nvidia" else majors.get(module)
        if major is None:
            missing = f"the {module} module is not loaded (no {module} in /proc/devices)"
            if module == "nvidia-uvm":
                missing += ": CUDA needs it; run 'nvidia-modprobe -u -c0' or 'modprobe nvidia-uvm'"
            control[name] = DeviceNode(name, os.path.join(config.dev_root, name), 0, minor, missing, NODE_MODULE_NOT_LOADED)
        else:
            control[name] = _node(config.dev_root, name, major, minor)

    searched = _driver_files(config, capabilities, library_globs, files_version)
    ipc: dict[str, IpcPath] = {}
    for cap in capabilities:
        for path in CAPABILITIES[cap].ipc:
            path = config.mps_pipe_directory if path == MPS_PIPE_DIRECTORY else path
            if path not in ipc:
                entry = _ipc_path(config.ipc_root, path, cap)
                if entry is not None:
                    ipc[path] = entry
    return Host(
        driver_version=found.driver_version,
        gpus=found.gpus,
        gpu_nodes=gpu_nodes,
        control_nodes=control,
        caps_major=majors.get("nvidia-caps"),
        mig_global_minors=_mig_global_minors(config.proc_root),
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
        features=tuple(_feature(config, majors, ask.name, ask.selector, ask.source, found.driver_version) for ask in features),
        dri_nodes=_dri_nodes(config, found.gpus) if any(CAPABILITIES[c].dri_nodes for c in capabilities) else {},
        tree_root=config.driver_root if library_version else "", tree_version=library_version,
        lost=found.lost,
        mismatch=_mismatch(config, capabilities, searched.libraries, library_version, found.driver_version),
    )


def _mismatch(config: Config, capabilities: tuple[str, ...], libraries: tuple[DriverFile, ...], library_version: str, kernel: str) -> str:
    """Why the driver root has no libcuda.so.1 or libnvidia-ml.so.1 of the kernel module's
    version when that is an upgrade without a reboot; looked at only when one the request
    needs is missing, and said of that one (libnvidia-ml.so.1 for utility alone)."""
    sonames = tuple(s for s in ("libcuda.so.1", "libnvidia-ml.so.1") if any(s in CAPABILITIES[c].required_libraries for c in capabilities))
    sonames = sonames or ("libcuda.so.1", "libnvidia-ml.so.1")
    if library_version or set(sonames) <= {lib.soname for lib in libraries if lib.bits == 64}:
        return ""
    from ponytail.host.driver_files import version_mismatch

    return version_mismatch(config.driver_root, kernel, sonames) or ""


def _feature(config: Config, majors: dict[str, int], name: str, selector: str, source: str, driver_version: str) -> FeatureFinding:
    """Every node of feature ``name`` that ``selector`` names (``all``, or IMEX channel numbers),
    each a character device of the major /proc/devices gives its module; missing ones are problems,
    and so is the feature's daemon when it is installed but of another driver."""
    feature = FEATURES[name]
    why = f"{source}: {feature.what}"
    nodes: list[DeviceNode] = []
    problems: list[str] = []
    for prefix, numbered, module in feature.nodes:
        major = majors.get(module)
        found: list[tuple[str, int | None]] = _numbered_nodes(config.dev_root, prefix) if numbered else [(prefix, None)]
        if name == IMEX_FEATURE and selector != "all":
            found = []
            for channel in selector.split(","):
                if not _is_number(channel):
                    problems.append(f"{why}: {channel!r} is not a channel number")
                else:
                    found.append((f"{prefix}{int(channel)}", int(channel)))
        if major is None:
            problems.append(f"{why} asked, but no {module} in {config.proc_root}/devices: {feature.hint}")
            continue
        if not found:
            problems.append(f"{why} asked, but there is no {os.path.join(config.dev_root, prefix)}{'<N>' if numbered else ''}: {feature.hint}")
        for node_name, minor in found:
            node = _node(config.dev_root, node_name, major, minor) if minor is not None else _any_minor(config.dev_root, node_name, major)
            if node.problem is not None:
                missing = not os.path.lexists(node.host_path)
                problems.append(f"{why} asked, but {f'{node.host_path} does not exist: {feature.hint}' if missing else node.problem}")
            nodes.append(node)
    mismatch = _daemon_mismatch(config.driver_root, feature.daemon, driver_version) if feature.daemon and not problems else None
    if mismatch is not None:
        problems.append(f"{why} asked, but {mismatch}")
    paths = _feature_paths(config, feature, why)
    for path in paths:
        inside = _channel_inside(path.host_path) if path.is_dir else None
        if inside is not None:
            problems.append(
                f"{why} asked, but {path.host_path} holds {inside}: ponytail never mounts a host daemon's socket or FIFO "
                f"into a container; remove it from there, or do not ask for {feature.variable}"
            )
    return FeatureFinding(name, why, tuple(n for n in nodes if n.problem is None), paths, tuple(problems))


DAEMON_READ_LIMIT = 256 << 20


def _daemon_mismatch(driver_root: str, daemon: str, driver_version: str) -> str | None:
    """Why the installed ``daemon`` (nv-fabricmanager, nvidia-imex) is not of the running driver,
    or None (not installed here: it may run elsewhere, in a container; or of this driver). Its
    version is compiled into it, so the binary must name the driver's version: a mismatched
    one makes CUDA fail in the container with error 802 (system not yet initialized)."""
    binary = find_binary(driver_root, daemon, "check")
    if binary is None:
        return None
    named = versions_named(binary.host_path, (driver_version,))
    if isinstance(named, str):
        return named
    if named:
        return None
    return (
        f"{binary.host_path} is not of the running driver {driver_version} (it does not name that version; CUDA would "
        f"fail with error 802): install the {daemon} of driver {driver_version} and restart it"
    )


def versions_named(path: str, versions: tuple[str, ...]) -> set[str] | str:
    """Which of ``versions`` the program at ``path`` names (NVIDIA's programs carry their driver's
    version as a string), read in chunks up to DAEMON_READ_LIMIT; a string says why it cannot be read."""
    wanted = {v: v.encode() for v in versions}
    longest = max((len(w) for w in wanted.values()), default=0)
    found: set[str] = set()
    tail = b""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        return f"{path} cannot be read to check its version: {e.strerror}"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return f"{path} is not a regular file"
        for _ in range(DAEMON_READ_LIMIT >> 20):
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            window = tail + chunk
            found |= {v for v, w in wanted.items() if w in window}
            if len(found) == len(wanted):
                break
            tail = chunk[-longest:]
    finally:
        os.close(fd)
    return found


def _feature_paths(config: Config, feature: Feature, why: str) -> tuple[IpcPath, ...]:
    paths = []
    for path, root, is_dir in [(f, config.driver_root, False) for f in feature.files] + [(d, config.ipc_root, True) for d in feature.directories]:
        full = host_path(root, path)
        try:
            mode = os.stat(full, follow_symlinks=False).st_mode
        except OSError:
            continue
        if stat.S_ISDIR(mode) if is_dir else stat.S_ISREG(mode):
            paths.append(IpcPath(full, path, is_dir, why))
    return tuple(paths)


FEATURE_DIRECTORY_ENTRIES = 1 << 16  # a feature's directory with more entries than this is not looked through: refused


def _channel_inside(directory: str) -> str | None:
    """The first socket or FIFO under ``directory`` (not following links), what stops a walk
    (an unreadable directory, too many entries), or None: a directory a feature mounts must
    hold data only, never a host daemon's channel (udevd's control socket beside its database)."""
    pending, seen = [directory], 0
    while pending:
        current = pending.pop()
        try:
            with os.scandir(current) as entries:
                for entry in entries:
                    seen += 1
                    if seen > FEATURE_DIRECTORY_ENTRIES:
                        return f"more than {FEATURE_DIRECTORY_ENTRIES} entries (not looked through)"
                    if entry.is_file(follow_symlinks=False) or entry.is_symlink():  # the type from readdir: no stat
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
                        continue
                    mode = entry.stat(follow_symlinks=False).st_mode
                    if stat.S_ISSOCK(mode) or stat.S_ISFIFO(mode):
                        return f"the {'socket' if stat.S_ISSOCK(mode) else 'FIFO'} {entry.path}"
        except OSError as e:
            return f"{current}, which cannot be read ({e.strerror})"
    return None


def _numbered_nodes(dev_root: str, prefix: str) -> list[tuple[str, int | None]]:
    """(name, minor) of each ``<prefix><N>`` under ``dev_root``, by N; the minor is checked by
    its major only (a uverbs node's minor is 192+N)."""
    directory, start = os.path.split(prefix)
    try:
        names = os.listdir(os.path.join(dev_root, directory))
    except OSError:
        return []
    numbers = sorted(int(n[len(start):]) for n in names if n.startswith(start) and _is_number(n[len(start):]))
    return [(os.path.join(directory, f"{start}{n}"), None) for n in numbers]


def _is_number(text: str) -> bool:
    return 0 < len(text) < 10 and text.isascii() and text.isdigit()


def _any_minor(dev_root: str, name: str, major: int) -> DeviceNode:
    """The node ``name``, which must be a character device of ``major``; its minor is what it has."""
    path = os.path.join(dev_root, name)
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return _node(dev_root, name, major, 0)
    minor = os.minor(st.st_rdev)
    if not stat.S_ISCHR(st.st_mode):
        return DeviceNode(name, path, major, minor, f"{path} is not a character device")
    if os.major(st.st_rdev) != major:
        return DeviceNode(name, path, major, minor, f"{path} is c {os.major(st.st_rdev)}:{minor}, expected major {major}")
    return DeviceNode(name, path, major, minor, None)


def _driver_files(
    config: Config, capabilities: tuple[str, ...], library_globs: tuple[str, ...] | None, files_version: str
) -> FoundFiles:
    """The driver root's libraries (with the searches' reports and what was skipped),
    binaries and other files for ``capabilities``: from the probe cache when nothing it
    depends on changed (ponytail.host.probecache), else searched."""
    searches = _library_searches(config, capabilities, library_globs)
    wanted_binaries = [
        (name, cap) for cap in capabilities for name in CAPABILITIES[cap].binaries + config.capability_extras.get(cap, {}).get("binaries", ())
    ]
    machine = os.uname().machine
    patterns = [
        (tuple(g.replace("{machine}", machine).replace("{version}", files_version) for g in CAPABILITIES[cap].files), cap)
        for cap in capabilities
    ]
    if capabilities:
        patterns.append((tuple(f"{d}/gsp*.bin" for d in firmware_dirs(config.sys_root, files_version)), "GSP firmware"))
    listed, list_skipped = _from_filelist(config, capabilities, library_globs)
    for path, why in listed:
        if os.path.dirname(path) in BIN_DIRS:
            wanted_binaries.append((os.path.basename(path), why))
        elif ".so" in os.path.basename(path):
            searches.append(LibrarySearch.for_glob(path, why))
        else:
            patterns.append(((path,), why))

    def search() -> FoundFiles:
        libraries, reports, skipped = find_libraries(config.driver_root, searches, files_version)
        skipped += list_skipped
        binaries: list[DriverFile] = []
        others = _other_versions(skipped)
        for name, cap in wanted_binaries:
            binary = find_binary(config.driver_root, name, cap, cap if cap in CAPABILITIES else "")
            if binary is None:
                skipped.append(SkippedFile(name, f"{cap}: binary not found in the driver root's bin directories"))
            elif binary.target not in {b.target for b in binaries}:
                other = _binary_of_another_driver(binary, others, files_version)
                if other:
                    skipped.append(SkippedFile(binary.path, other))
                else:
                    binaries.append(binary)
        files: dict[str, DriverFile] = {}  # by target: the tables' find first, the driver's file list after them
        for globs, why in patterns:
            for f in find_files(config.driver_root, globs, why):
                files.setdefault(f.target, f)
        return FoundFiles(tuple(libraries), tuple(reports), tuple(skipped), tuple(binaries), tuple(files.values()))

    from ponytail.host.probecache import cached_search

    key = (
        files_version, os.uname().machine, tuple((s.pattern, s.dirs, s.why, s.bits) for s in searches),
        tuple(wanted_binaries), tuple(patterns),
    )
    dirs = {d for s in searches for d in s.dirs} | set(BIN_DIRS) | {os.path.dirname(g) for globs, _ in patterns for g in globs}
    return cached_search(config.cache_dir, config.driver_root, key, tuple(sorted(dirs)), search)


def _other_versions(skipped: list[SkippedFile]) -> tuple[str, ...]:
    """The driver versions of the libraries the search skipped for being of another driver (an
    upgrade not yet rebooted into, a leftover): the versions a binary beside them may be of."""
    from ponytail.host.driver_files import OTHER_VERSION, library_version

    return tuple(dict.fromkeys(v for s in skipped if s.reason.startswith(OTHER_VERSION) and (v := library_version(s.path))))


def _binary_of_another_driver(binary: DriverFile, others: tuple[str, ...], version: str) -> str:
    """Why ``binary`` is another driver's (it names one of ``others``, not ``version``), or "".
    Read only where the driver root holds another driver's libraries: NVIDIA's programs name
    their driver's version, and an upgraded node's new nvidia-smi fails against the old module."""
    if not others:
        return ""
    named = versions_named(binary.host_path, (version, *others))
    if isinstance(named, str) or version in named or not named:
        return ""
    return f"driver version {', '.join(v for v in others if v in named)} (named in the program), but the running driver is {version}"


def _from_filelist(
    config: Config, capabilities: tuple[str, ...], library_globs: tuple[str, ...] | None
) -> tuple[list[tuple[str, str]], list[SkippedFile]]:
    """The files of the driver's own list (ponytail.host.filelist) for ``capabilities`` that the
    tables miss, each with why it is there, and what was skipped in the list; none with -libs."""
    if not capabilities or library_globs is not None or not os.path.lexists(host_path(config.driver_root, FILELIST)):
        return [], []  # most drivers ship no list: one lstat, and ponytail.host.filelist stays unimported
    from ponytail.host.filelist import missing_from_tables, read_filelist

    entries, notes = read_filelist(config.driver_root)
    wanted = [(path, cap) for path, cap in missing_from_tables(entries) if cap in capabilities]
    listed = [(path, f"{cap}, from the driver's file list {FILELIST}") for path, cap in wanted]
    return listed, [SkippedFile(FILELIST, note) for note in notes]


def find_driver_library(config: Config, driver_version: str, name: str, soname: str, host: Host | None = None) -> str:
    """Host path of the running driver's ``soname`` (e.g. libcuda.so.1), whether or not the
    request's capabilities brought it into ``host``; ProbeError if the driver has none."""
    return find_driver_file(config, driver_version, name, soname, host).host_path


def find_driver_file(config: Config, driver_version: str, name: str, soname: str, host: Host | None = None) -> DriverFile:
    """``find_driver_library``'s file, with its path inside the driver root."""
    lib = host.library(soname) if host is not None else None
    if lib is None:
        search = LibrarySearch.for_name(name, "probe")

        def run() -> FoundFiles:
            libraries, reports, skipped = find_libraries(config.driver_root, [search], driver_version)
            return FoundFiles(tuple(libraries), tuple(reports), tuple(skipped))

        from ponytail.host.probecache import cached_search

        key = (driver_version, os.uname().machine, ((search.pattern, search.dirs, search.why, search.bits),), (), ())
        found = cached_search(config.cache_dir, config.driver_root, key, search.dirs, run).libraries
        lib = next((f for f in found if f.soname == soname), None)
    if lib is None:
        raise ProbeError(f"no {soname} of driver {driver_version} under the driver root {config.driver_root}")
    return lib


def _library_searches(config: Config, capabilities: tuple[str, ...], override: tuple[str, ...] | None) -> list[LibrarySearch]:
    if override is not None:
        return [LibrarySearch.for_glob(g, "-libs") for g in override]
    searches = []
    bits = (64, 32) if "compat32" in capabilities else (64,)
    for width in bits:
        for cap in capabilities:
            names = CAPABILITIES[cap].libraries + config.capability_extras.get(cap, {}).get("libraries", ())
            searches += [LibrarySearch.for_name(name, cap, width) for name in names]
    searches += [LibrarySearch.for_glob(g, "[library] paths") for g in config.library_paths]
    return searches


def firmware_dirs(sys_root: str, version: str) -> tuple[str, ...]:
    """Where the kernel's firmware loader looks for the GSP firmware of driver ``version``, in its
    order: the directory in firmware_class.path (``<sys_root>/module/firmware_class/parameters/path``,
    when set to a plain absolute path), /lib/firmware/updates/<release>, /lib/firmware/updates,
    /lib/firmware/<release>, /lib/firmware; each with nvidia/<version> under it."""
    release = os.uname().release
    bases = [f"/lib/firmware/updates/{release}", "/lib/firmware/updates", f"/lib/firmware/{release}", "/lib/firmware"]
    try:
        with open(os.path.join(sys_root, "module/firmware_class/parameters/path"), "rb") as f:
            custom = f.read(4096).decode("utf-8", "replace").strip()
    except OSError:
        custom = ""
    # a plain absolute path only: no glob characters, no "..", nothing but what normpath keeps
    if custom.startswith("/") and os.path.normpath(custom) == custom.rstrip("/") and not any(c in custom for c in "*?[\n"):
        bases.insert(0, custom.rstrip("/") or "/")
    return tuple(dict.fromkeys(f"{b.rstrip('/')}/nvidia/{version}" for b in bases))


def _dri_nodes(config: Config, gpus: tuple[Gpu, ...]) -> dict[str, tuple[DeviceNode, ...]]:
    """Each GPU's DRM nodes, found from its PCI address: the card* and renderD* entries of
    <sys_root>/bus/pci/devices/<bus id>/drm, with the major:minor in their ``dev`` files, each
    checked at <dev_root>/dri/<name> to be that character device (major 226). Never all of /dev/dri."""
    found: dict[str, tuple[DeviceNode, ...]] = {}
    for gpu in gpus:
        drm = os.path.join(config.sys_root, "bus/pci/devices", gpu.pci_bus_id, "drm")
        try:
            names = sorted(n for n in os.listdir(drm) if _is_dri_name(n))
        except OSError:
            continue
        nodes = []
        for name in names:
            dev = os.path.join(drm, name, "dev")
            try:
                with open(dev, "rb") as f:
                    major_text, _, minor_text = f.read(64).decode("ascii", "replace").strip().partition(":")
                major, minor = int(major_text), int(minor_text)
            except (OSError, ValueError):
                nodes.append(DeviceNode(f"dri/{name}", os.path.join(config.dev_root, "dri", name), DRM_MAJOR, 0, f"cannot read {dev} as MAJOR:MINOR"))
                continue
            if major != DRM_MAJOR:
                nodes.append(DeviceNode(
                    f"dri/{name}", os.path.join(config.dev_root, "dri", name), major, minor,
                    f"{dev} says {major}:{minor}, not a DRM device (major {DRM_MAJOR})",
                ))
                continue
            nodes.append(_node(config.dev_root, f"dri/{name}", DRM_MAJOR, minor))
        found[gpu.pci_bus_id] = tuple(nodes)
    return found


def _is_dri_name(name: str) -> bool:
    """card<N> or renderD<N> (not a connector such as card1-DP-1, nor the old controlD64)."""
    for prefix in ("card", "renderD"):
        rest = name[len(prefix):]
        if name.startswith(prefix) and rest.isascii() and rest.isdecimal():
            return True
    return False


def _ipc_path(ipc_root: str, path: str, why: str) -> IpcPath | None:
    full = host_path(ipc_root, path)
    try:
        st = os.stat(full, follow_symlinks=False)
    except OSError:
        return None
    if stat.S_ISSOCK(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return IpcPath(full, path, stat.S_ISDIR(st.st_mode), why)
    return None


def _mig_global_minors(proc_root: str) -> dict[str, int]:
    minors = {}
    for name in ("config", "monitor"):
        minor = read_access_minor(os.path.join(caps_dir(proc_root), "mig", name))
        if minor is not None:
            minors[name] = minor
    return minors


def _node(dev_root: str, name: str, major: int, minor: int) -> DeviceNode:
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


def find_ldconfig(configured: str) -> str | None:
    """The host's ldconfig: the configured one (an error when it cannot be run), or the
    first of the usual places."""
    if configured and not (os.path.isfile(configured) and os.access(configured, os.X_OK)):
        why = "does not exist" if not os.path.lexists(configured) else "is not an executable file"
        raise ProbeError(f"[host] ldconfig in the config is {configured!r}, which {why}: set it to the host's ldconfig, or leave it empty")
    for candidate in (configured,) if configured else LDCONFIG_CANDIDATES:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None
