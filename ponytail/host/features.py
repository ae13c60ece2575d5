"""The opt-in features a container asks for (IMEX channels, GDS, MOFED, GDRCopy, NVSwitch), as
found on the host: their nodes, files and directories, whether a directory holds a host daemon's
channel, whether an installed daemon is of the running driver (versions_named: which driver
versions a program names); and the daemons' sockets and pipe directories of the capabilities."""

from __future__ import annotations

import os
import stat

from ponytail.capabilities import FEATURES, IMEX_FEATURE, Feature
from ponytail.config import Config
from ponytail.fs.hostfiles import under_root
from ponytail.host.driver_files import find_binary
from ponytail.host.nodes import any_minor_node, is_number, numbered_nodes
from ponytail.host.records import DeviceNode, FeatureFinding, IpcPath, char_node


def feature_finding(config: Config, majors: dict[str, int], name: str, selector: str, source: str, driver_version: str) -> FeatureFinding:
    """Every node of feature ``name`` that ``selector`` names (``all``, or IMEX channel numbers),
    each a character device of the major /proc/devices gives its module; missing ones are problems,
    and so is the feature's daemon when it is installed but of another driver."""
    feature = FEATURES[name]
    why = f"{source}: {feature.what}"
    nodes: list[DeviceNode] = []
    problems: list[str] = []
    for prefix, numbered, module in feature.nodes:
        major = majors.get(module)
        found: list[tuple[str, int | None]] = numbered_nodes(config.dev_root, prefix) if numbered else [(prefix, None)]
        if name == IMEX_FEATURE and selector != "all":
            found = []
            for channel in selector.split(","):
                if not is_number(channel):
                    problems.append(f"{why}: {channel!r} is not a channel number")
                else:
                    found.append((f"{prefix}{int(channel)}", int(channel)))
        if major is None:
            problems.append(f"{why} asked, but no {module} in {config.proc_root}/devices: {feature.hint}")
            continue
        if not found:
            problems.append(f"{why} asked, but there is no {os.path.join(config.dev_root, prefix)}{'<N>' if numbered else ''}: {feature.hint}")
        for node_name, minor in found:
            node = char_node(config.dev_root, node_name, major, minor) if minor is not None else any_minor_node(config.dev_root, node_name, major)
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
        full = under_root(root, path)
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


def ipc_path(ipc_root: str, path: str, why: str) -> IpcPath | None:
    full = under_root(ipc_root, path)
    try:
        st = os.stat(full, follow_symlinks=False)
    except OSError:
        return None
    if stat.S_ISSOCK(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return IpcPath(full, path, stat.S_ISDIR(st.st_mode), why)
    return None
