"""The driver's user-space files: libraries found by glob and by the driver root's
ld.so.cache, filtered to the running driver's version, with their SONAMEs; and
its binaries (nvidia-smi) from the driver root's bin directories.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
from dataclasses import dataclass, field

from ponytail.host.elf import MACHINE_BY_UNAME, NotElf, read_elf_info
from ponytail.host.ldcache import read_ld_cache
from ponytail.inroot import real_path_in_root

BIN_DIRS = ("/usr/bin", "/usr/local/nvidia/bin", "/usr/local/bin", "/bin", "/usr/sbin", "/sbin", "/opt/nvidia/bin")
CONTAINER_BIN_DIR = "/usr/bin"
_VERSION_SUFFIX = re.compile(r"\.so\.(\d+(?:\.\d+)+)$")
_DRIVER_LIKE = re.compile(r"^\d{3,}\.\d+(\.\d+)?$")


@dataclass(frozen=True)
class DriverFile:
    """A host file to inject. ``path`` is inside the driver root; ``target`` inside the container."""

    path: str
    host_path: str
    target: str
    soname: str | None
    found_by: str


@dataclass(frozen=True)
class SkippedFile:
    path: str
    reason: str


@dataclass(frozen=True)
class GlobReport:
    """What one library glob matched (in-root paths), before filtering."""

    pattern: str
    matches: tuple[str, ...]
    from_cache: tuple[str, ...] = ()


@dataclass
class _Search:
    root: str
    root_fd: int
    version: str
    machine: int | None
    listings: dict[str, list[str]] = field(default_factory=dict)
    found: dict[str, DriverFile] = field(default_factory=dict)
    skipped: dict[str, SkippedFile] = field(default_factory=dict)
    elf_checked: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)


def find_libraries(
    driver_root: str, globs: tuple[str, ...], driver_version: str
) -> tuple[list[DriverFile], list[GlobReport], list[SkippedFile]]:
    """Libraries of the running driver matched by ``globs`` (directly or through ld.so.cache)."""
    root_fd = _open_root(driver_root)
    if root_fd is None:
        return [], [GlobReport(g, ()) for g in globs], [SkippedFile(driver_root, "driver root does not exist")]
    search = _Search(driver_root, root_fd, driver_version, MACHINE_BY_UNAME.get(os.uname().machine))
    try:
        cache = read_ld_cache(_host(driver_root, "/etc/ld.so.cache"))
        reports = [_match_glob(search, pattern, cache) for pattern in globs]
    finally:
        os.close(root_fd)
    return list(search.found.values()), reports, list(search.skipped.values())


def find_binary(driver_root: str, name: str) -> DriverFile | None:
    """The first ``name`` in the driver root's bin directories, injected as /usr/bin/<name>."""
    root_fd = _open_root(driver_root)
    if root_fd is None:
        return None
    try:
        for directory in BIN_DIRS:
            real = real_path_in_root(root_fd, f"{directory}/{name}")
            if real is not None:
                return DriverFile(real, _host(driver_root, real), f"{CONTAINER_BIN_DIR}/{name}", None, directory)
    finally:
        os.close(root_fd)
    return None


def _match_glob(search: _Search, pattern: str, cache: list[tuple[str, str]]) -> GlobReport:
    directory, name_pattern = os.path.split(pattern)
    matches: list[str] = []
    for d in _expand_dirs(search.root, directory):
        matches.extend(f"{d}/{n}" for n in sorted(fnmatch.filter(_listing(search, d), name_pattern)))
    matched_dirs = {os.path.dirname(m) for m in matches}
    from_cache = sorted(
        {path for name, path in cache if fnmatch.fnmatchcase(name, name_pattern) and os.path.dirname(path) not in matched_dirs}
    )
    for path in matches:
        _consider(search, path, f"glob {pattern}")
    for path in from_cache:
        _consider(search, path, f"ld.so.cache entry ({name_pattern})")
    return GlobReport(pattern, tuple(matches), tuple(from_cache))


def _consider(search: _Search, path: str, found_by: str) -> None:
    real = real_path_in_root(search.root_fd, path)
    if real is None:
        search.skipped.setdefault(path, SkippedFile(path, "not found (dangling link, or leaves the driver root)"))
        return
    if real in search.found or real in search.skipped:
        return
    m = _VERSION_SUFFIX.search(real)
    if m and m.group(1) != search.version and _DRIVER_LIKE.match(m.group(1)):
        search.skipped[real] = SkippedFile(
            real, f"driver version {m.group(1)}, but the running driver is {search.version} (left over from an upgrade?)"
        )
        return
    soname, problem = _check_elf(search, real)
    if problem:
        search.skipped[real] = SkippedFile(real, problem)
        return
    search.found[real] = DriverFile(real, _host(search.root, real), real, soname, found_by)


def _check_elf(search: _Search, real: str) -> tuple[str | None, str | None]:
    try:
        info = read_elf_info(_host(search.root, real))
    except NotElf:
        return None, "not an ELF shared library"
    except OSError as e:
        return None, f"cannot read: {e.strerror}"
    if search.machine is not None and info.machine != search.machine:
        return None, f"built for another architecture (ELF machine {info.machine}, {info.bits}-bit)"
    return info.soname, None


def _expand_dirs(root: str, directory: str) -> list[str]:
    if not glob.has_magic(directory):
        return [directory]
    prefix = root.rstrip("/")
    return sorted(d[len(prefix):] or "/" for d in glob.glob(prefix + directory) if os.path.isdir(d))


def _listing(search: _Search, directory: str) -> list[str]:
    names = search.listings.get(directory)
    if names is None:
        try:
            names = os.listdir(_host(search.root, directory))
        except OSError:
            names = []
        search.listings[directory] = names
    return names


def _host(root: str, path: str) -> str:
    return root.rstrip("/") + path if root != "/" else path


def _open_root(path: str) -> int | None:
    try:
        return os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
