"""The driver's user-space files: libraries found by name (in the usual library
directories and the driver root's own ld.so.cache) or by the user's globs, filtered
to the running driver's version and this machine's architecture, with their SONAMEs;
binaries from the driver root's bin directories; other driver files (ICD/JSON,
firmware) by glob.
"""

from __future__ import annotations

import os
import stat

from ponytail.fs.hostfiles import under_root
from ponytail.lite.records import field, record

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported on the hook's path: for type checkers only
    from ponytail.host.elf import ElfInfo

# glob, fnmatch, bisect, ponytail.host.elf, .ldcache and ponytail.fs.inroot are imported where
# a search runs: a hook served from the probe cache (ponytail.host.probecache) needs only
# the records below

BIN_DIRS = ("/usr/bin", "/usr/local/nvidia/bin", "/usr/local/bin", "/bin", "/usr/sbin", "/sbin", "/opt/nvidia/bin")
CONTAINER_BIN_DIR = "/usr/bin"
FILELIST = "/usr/share/nvidia/files.d/sandboxutils-filelist.json"  # the driver's own list (ponytail.host.filelist)
_TRIPLET = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu", "ppc64le": "powerpc64le-linux-gnu"}
_GLOB_MAGIC = "*?["
OTHER_VERSION = "driver version"  # how a skipped file of another driver's version is said
OTHER_ARCHITECTURE = "built for another architecture"  # and one of another architecture


def library_dirs(bits: int = 64) -> tuple[str, ...]:
    """Where drivers keep their libraries on the usual distributions and clouds."""
    if bits == 32:
        return ("/usr/lib/i386-linux-gnu", "/usr/lib/i386-linux-gnu/vdpau", "/usr/lib32", "/usr/lib", "/usr/lib/vdpau", "/usr/local/nvidia/lib")
    triplet = _TRIPLET.get(os.uname().machine, "x86_64-linux-gnu")
    return (
        f"/usr/lib/{triplet}", f"/usr/lib/{triplet}/vdpau", "/usr/lib64", "/usr/lib64/vdpau",
        "/usr/local/nvidia/lib64", "/usr/lib", "/usr/lib/vdpau",
    )


@record(frozen=True)
class LibrarySearch:
    """Look for file names matching ``pattern`` in ``dirs`` (globs allowed) and in the
    driver root's ld.so.cache; ``why`` says who asked (a capability, a config glob)."""

    pattern: str
    dirs: tuple[str, ...]
    why: str
    bits: int = 64

    @classmethod
    def for_name(cls, name: str, why: str, bits: int = 64) -> LibrarySearch:
        return cls(f"{name}.so.*", library_dirs(bits), why, bits)

    @classmethod
    def for_glob(cls, path_glob: str, why: str) -> LibrarySearch:
        directory, pattern = os.path.split(path_glob)
        return cls(pattern, (directory,), why)

    def describe(self) -> str:
        where = self.dirs[0] + "/" if len(self.dirs) == 1 else ""
        arch = ", 32-bit" if self.bits == 32 else ""
        return f"{where}{self.pattern} ({self.why}{arch})"


@record(frozen=True)
class DriverFile:
    """A host file to inject. ``path`` is inside the driver root; ``target`` inside the container."""

    path: str
    host_path: str
    target: str
    soname: str | None
    found_by: str  # why, for people: "utility, in /usr/bin"
    bits: int = 64
    needed: tuple[str, ...] = ()  # the libraries it links against (DT_NEEDED), for the image's check
    capability: str = ""  # the capability it was found for ("" when none, e.g. the driver's file list), for code


@record(frozen=True)
class SkippedFile:
    path: str
    reason: str


@record(frozen=True)
class SearchReport:
    """What one search matched (in-root paths), before filtering."""

    search: str
    matches: tuple[str, ...]
    from_cache: tuple[str, ...] = ()


@record(frozen=True)
class FoundFiles:
    """What one search of the driver root found: the probe's result, remembered as it is by
    ponytail.host.probecache."""

    libraries: tuple[DriverFile, ...] = ()
    reports: tuple[SearchReport, ...] = ()
    skipped: tuple[SkippedFile, ...] = ()
    binaries: tuple[DriverFile, ...] = ()
    files: tuple[DriverFile, ...] = ()


@record
class _Scan:
    """One pass over the driver root: directory listings and ELF checks are done once."""

    root: str
    root_fd: int
    version: str
    cache: list[tuple[str, str]]  # (file name, path), sorted
    listings: dict[str, list[str]] = field(default_factory=dict)
    found: dict[tuple[str, int], DriverFile] = field(default_factory=dict)
    skipped: dict[tuple[str, int], SkippedFile] = field(default_factory=dict)
    real_dirs: dict[str, str | None] = field(default_factory=dict)


def find_libraries(
    driver_root: str, searches: list[LibrarySearch], driver_version: str
) -> tuple[list[DriverFile], list[SearchReport], list[SkippedFile]]:
    """Libraries of the running driver that ``searches`` find, each real file once."""
    from ponytail.host.ldcache import read_ld_cache_in_root

    root_fd = _open_root(driver_root)
    if root_fd is None:
        reports = [SearchReport(s.describe(), ()) for s in searches]
        return [], reports, [SkippedFile(driver_root, "driver root does not exist")]
    cache = sorted(read_ld_cache_in_root(root_fd))
    scan = _Scan(driver_root, root_fd, driver_version, cache)
    try:
        reports = [_search(scan, s) for s in searches]
    finally:
        os.close(root_fd)
    return list(scan.found.values()), reports, list(scan.skipped.values())


def find_binary(driver_root: str, name: str, why: str, capability: str = "") -> DriverFile | None:
    """The first ``name`` in the driver root's bin directories, injected as /usr/bin/<name>; found
    for ``capability`` (when one)."""
    from ponytail.fs.inroot import real_path_in_root

    root_fd = _open_root(driver_root)
    if root_fd is None:
        return None
    try:
        for directory in BIN_DIRS:
            real = real_path_in_root(root_fd, f"{directory}/{name}")
            if real is not None:
                info, _ = _read_elf(root_fd, real)  # a script has no libraries to need
                needed = info.needed if info is not None else ()
                return DriverFile(real, under_root(driver_root, real), f"{CONTAINER_BIN_DIR}/{name}", None, f"{why}, in {directory}", 64, needed,
                                  capability=capability)
    finally:
        os.close(root_fd)
    return None


def find_files(driver_root: str, patterns: tuple[str, ...], why: str) -> list[DriverFile]:
    """Regular files under the driver root matching path globs, injected at the same path."""
    import glob

    from ponytail.fs.inroot import real_path_in_root

    root_fd = _open_root(driver_root)
    if root_fd is None:
        return []
    found: dict[str, DriverFile] = {}
    try:
        prefix = driver_root.rstrip("/")
        for pattern in patterns:
            for match in sorted(glob.glob(prefix + pattern)):
                real = real_path_in_root(root_fd, match[len(prefix):])
                if real is not None and real not in found and os.path.isfile(under_root(driver_root, real)):
                    found[real] = DriverFile(real, under_root(driver_root, real), match[len(prefix):], None, why)
    finally:
        os.close(root_fd)
    return list(found.values())


def _search(scan: _Scan, search: LibrarySearch) -> SearchReport:
    matches: list[str] = []
    for d in (x for directory in search.dirs for x in _expand_dirs(scan.root, directory)):
        matches.extend(f"{d}/{n}" for n in _sorted_matches(_listing(scan, d), search.pattern))
    seen = set(matches)
    from_cache = sorted({p for _, p in _sorted_matches(scan.cache, search.pattern) if p not in seen})
    for path in matches:
        _consider(scan, path, search, "")
    for path in from_cache:
        _consider(scan, path, search, " via ld.so.cache")
    return SearchReport(search.describe(), tuple(matches), tuple(from_cache))


def _consider(scan: _Scan, path: str, search: LibrarySearch, how: str) -> None:
    real = _real_path(scan, path)
    if real is None:
        scan.skipped.setdefault((path, search.bits), SkippedFile(path, "not found (dangling link, or leaves the driver root)"))
        return
    key = (real, search.bits)
    if key in scan.found or key in scan.skipped:
        return
    copy = _renamed_copy(real)
    if copy:
        scan.skipped[key] = SkippedFile(real, copy)
        return
    version = _library_version(real)
    if version is not None and version != scan.version and _driver_like(version):
        scan.skipped[key] = SkippedFile(real, f"{OTHER_VERSION} {version}, but the running driver is {scan.version}")
        return
    info, problem = _check_elf(scan, real, search.bits)
    if info is None:
        scan.skipped[key] = SkippedFile(real, problem)
        return
    scan.found[key] = DriverFile(real, under_root(scan.root, real), real, info.soname, f"{search.why}{how}", search.bits, info.needed)


def _library_version(path: str) -> str | None:
    """The dotted number that ends a library's name after '.so.' ('550.54.15' of
    libcuda.so.550.54.15; '1.2' of libfoo.so.1.2; none for libcuda.so.1), or None."""
    _, so, version = path.rpartition(".so.")
    parts = version.split(".")
    return version if so and len(parts) > 1 and all(p.isdecimal() for p in parts) else None


def _renamed_copy(path: str) -> str:
    """Why a name is not a library's own, or "": after '.so.' a library's name has numbers
    only (libcuda.so.1, libcuda.so.550.54.15); libcuda.so.535.104.05.bak, .old, .dpkg-new
    or ~ are copies someone kept (of an older driver, often), never the running one's."""
    _, so, suffix = path.rpartition(".so.")
    if not so or all(p.isdecimal() and p.isascii() for p in suffix.split(".")):
        return ""
    numbers = []
    for part in suffix.split("."):
        digits = part[:len(part) - len(part.lstrip("0123456789"))]
        if digits:
            numbers.append(digits)
        if digits != part:
            break
    of = f" of driver {'.'.join(numbers)}'s library" if numbers and _driver_like(".".join(numbers)) else ""
    return f"a renamed copy{of} (only names ending in .so.<numbers> are libraries; a backup?)"


def library_version(path: str) -> str | None:
    """A driver's version in a library's file name (libcuda.so.550.54.15), or None."""
    version = _library_version(path)
    return version if version is not None and _driver_like(version) else None


def _driver_like(version: str) -> bool:
    """A driver's version: 3+ digits, then one or two more numbers (550.54.15, 390.157)."""
    parts = version.split(".")
    return len(parts) <= 3 and len(parts[0]) >= 3


def _real_path(scan: _Scan, path: str) -> str | None:
    """``real_path_in_root(path)``, with each directory resolved once: the candidates of a
    search are mostly plain files in directories that other candidates share."""
    from ponytail.fs.inroot import real_path_in_root

    directory, name = os.path.split(path)
    if name in ("", ".", ".."):
        return real_path_in_root(scan.root_fd, path)
    if directory not in scan.real_dirs:
        scan.real_dirs[directory] = "" if directory == "/" else real_path_in_root(scan.root_fd, directory)
    real_dir = scan.real_dirs[directory]
    if real_dir is None:
        return None
    real = f"{real_dir}/{name}"
    try:
        mode = os.lstat(under_root(scan.root, real)).st_mode
    except OSError:
        return None
    if stat.S_ISLNK(mode):  # where it leads is resolved inside the root, from the start
        return real_path_in_root(scan.root_fd, path)
    return real


def _check_elf(scan: _Scan, real: str, bits: int) -> tuple[ElfInfo | None, str]:
    """The library's ELF header, or None and why it is not one of this architecture."""
    from ponytail.host.elf import EM_386, MACHINE_BY_UNAME

    info, problem = _read_elf(scan.root_fd, real)
    if info is None:
        return None, problem
    expected = EM_386 if bits == 32 else MACHINE_BY_UNAME.get(os.uname().machine)
    if expected is not None and info.machine != expected:
        return None, f"{OTHER_ARCHITECTURE} (ELF machine {info.machine}, {info.bits}-bit; wanted {bits}-bit)"
    return info, ""


def _read_elf(root_fd: int, real: str) -> tuple[ElfInfo | None, str]:
    from ponytail.fs.inroot import open_file_in_root
    from ponytail.host.elf import NotElf, read_elf_info_file

    fd = open_file_in_root(root_fd, real)  # like an image's file: a FIFO or a device there is never opened for reading
    if fd is None:
        return None, "not a regular file inside the driver root"
    try:
        with os.fdopen(fd, "rb") as f:
            return read_elf_info_file(f), ""
    except NotElf:
        return None, "not an ELF shared library"
    except OSError as e:
        return None, f"cannot read: {e.strerror}"


def _expand_dirs(root: str, directory: str) -> list[str]:
    if not _has_magic(directory):
        return [directory]
    import glob

    prefix = root.rstrip("/")
    return sorted(d[len(prefix):] or "/" for d in glob.glob(prefix + directory) if os.path.isdir(d))


def _has_magic(path: str) -> bool:
    return any(c in path for c in _GLOB_MAGIC)


def _listing(scan: _Scan, directory: str) -> list[str]:
    """The sorted names in ``directory``, read once however many searches look there."""
    names = scan.listings.get(directory)
    if names is None:
        try:
            names = sorted(os.listdir(under_root(scan.root, directory)))
        except OSError:
            names = []
        scan.listings[directory] = names
    return names


def _sorted_matches(entries: list, name_pattern: str) -> list:
    """The entries of a sorted list (names, or (name, path) pairs) whose name matches
    ``name_pattern``. Only the run that starts with the pattern's literal prefix is
    tried: a glob costs a binary search and its matches, not a pass over a driver
    root's ~1000 libraries. A pattern that is its prefix and one final '*' (a library's
    "libcuda.so.*") matches that whole run, without compiling a regex for fnmatch."""
    import bisect
    import fnmatch

    prefix = _literal_prefix(name_pattern)
    every_one = name_pattern == prefix + "*"
    start = bisect.bisect_left(entries, prefix, key=_name)
    found = []
    for entry in entries[start:]:
        name = _name(entry)
        if not name.startswith(prefix):
            break
        if every_one or fnmatch.fnmatchcase(name, name_pattern):
            found.append(entry)
    return found


def _literal_prefix(pattern: str) -> str:
    """The part of a glob before its first wildcard."""
    for i, c in enumerate(pattern):
        if c in _GLOB_MAGIC:
            return pattern[:i]
    return pattern


def _name(entry: str | tuple[str, str]) -> str:
    return entry if isinstance(entry, str) else entry[0]


def _open_root(path: str) -> int | None:
    try:
        return os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None


def soname_version(root: str, soname: str) -> tuple[str, str] | None:
    """(version, in-root path) of the first ``soname`` under ``root`` that resolves to a file
    named by a driver version, looked up in the usual library directories, then its
    ld.so.cache; symlinks are resolved inside ``root``."""
    version, real, _ = soname_state(root, soname)
    return (version, real) if version is not None and real is not None else None


def version_mismatch(driver_root: str, kernel: str, sonames: tuple[str, ...] = ("libcuda.so.1", "libnvidia-ml.so.1")) -> str | None:
    """NVML's 'Driver/library version mismatch' (libraries upgraded, the old module still
    loaded), said the one way every entry point says it, of the first of ``sonames`` that
    shows it; None when there is none."""
    for soname in sonames:
        found = soname_version(driver_root, soname)
        if found is not None and found[0] != kernel:
            return mismatch_message(driver_root, soname, *found, kernel)
    return None


def mismatch_message(driver_root: str, soname: str, version: str, path: str, kernel: str) -> str:
    return (
        f"{soname} under {driver_root} is version {version} ({path}) but the kernel module is {kernel} "
        f"(Driver/library version mismatch): reboot, or reload the module of the installed driver"
    )


def soname_state(root: str, soname: str) -> tuple[str | None, str | None, str | None]:
    """soname_version's (version, in-root path), and the first candidate that is a link leading to no file."""
    from ponytail.fs.inroot import real_path_in_root
    from ponytail.host.ldcache import read_ld_cache_in_root

    try:
        root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None, None, None
    dangling = None
    try:
        cache = read_ld_cache_in_root(root_fd)  # read like an image's file: no link out, no FIFO, a regular file only
        candidates = [f"{d}/{soname}" for d in library_dirs()] + [p for n, p in cache if n == soname]
        for candidate in candidates:
            real = real_path_in_root(root_fd, candidate)
            if real is None and dangling is None and os.path.islink(under_root(root, candidate)):
                dangling = candidate
            version = library_version(real) if real else None
            if version is not None and real is not None:
                return version, real, dangling
    finally:
        os.close(root_fd)
    return None, None, dangling
