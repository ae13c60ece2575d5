"""The search of the driver root for one request: which libraries, binaries and files the
capabilities (and -libs, and the driver's own file list) ask for, searched once and kept in the
probe cache (its SEARCH_CODE names this module); a library of another driver than the kernel
module's; the host's ldconfig; the firmware directories; a driver file by name."""

from __future__ import annotations

import os

from ponytail.capabilities import CAPABILITIES
from ponytail.config import Config
from ponytail.errors import ProbeError
from ponytail.fs.hostfiles import read_head, under_root
from ponytail.host.driver_files import (
    BIN_DIRS,
    FILELIST,
    DriverFile,
    FoundFiles,
    LibrarySearch,
    SkippedFile,
    find_binary,
    find_files,
    find_libraries,
)
from ponytail.host.features import versions_named

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported on the hook's path: for type checkers only
    from ponytail.host.records import Host

LDCONFIG_CANDIDATES = ("/sbin/ldconfig", "/usr/sbin/ldconfig", "/sbin/ldconfig.real", "/usr/bin/ldconfig")


def search_driver_files(
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
    if not capabilities or library_globs is not None or not os.path.lexists(under_root(config.driver_root, FILELIST)):
        return [], []  # most drivers ship no list: one lstat, and ponytail.host.filelist stays unimported
    from ponytail.host.filelist import missing_from_tables, read_filelist

    entries, notes = read_filelist(config.driver_root)
    wanted = [(path, cap) for path, cap in missing_from_tables(entries) if cap in capabilities]
    listed = [(path, f"{cap}, from the driver's file list {FILELIST}") for path, cap in wanted]
    return listed, [SkippedFile(FILELIST, note) for note in notes]


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
    custom = read_head(os.path.join(sys_root, "module/firmware_class/parameters/path"), 4096, default="").strip()
    # a plain absolute path only: no glob characters, no "..", nothing but what normpath keeps
    if custom.startswith("/") and os.path.normpath(custom) == custom.rstrip("/") and not any(c in custom for c in "*?[\n"):
        bases.insert(0, custom.rstrip("/") or "/")
    return tuple(dict.fromkeys(f"{b.rstrip('/')}/nvidia/{version}" for b in bases))


def library_mismatch(config: Config, capabilities: tuple[str, ...], libraries: tuple[DriverFile, ...], library_version: str, kernel: str) -> str:
    """Why the driver root has no libcuda.so.1 or libnvidia-ml.so.1 of the kernel module's
    version when that is an upgrade without a reboot; looked at only when one the request
    needs is missing, and said of that one (libnvidia-ml.so.1 for utility alone)."""
    sonames = tuple(s for s in ("libcuda.so.1", "libnvidia-ml.so.1") if any(s in CAPABILITIES[c].required_libraries for c in capabilities))
    sonames = sonames or ("libcuda.so.1", "libnvidia-ml.so.1")
    if library_version or set(sonames) <= {lib.soname for lib in libraries if lib.bits == 64}:
        return ""
    from ponytail.host.driver_files import version_mismatch

    return version_mismatch(config.driver_root, kernel, sonames) or ""


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
