"""The CUDA version the driver supports: what its libcuda's cuDriverGetVersion returns
(12040 means 12.4). That call needs no cuInit and opens no GPU. The library is code from
the driver root or a registered driver tree, so it is never loaded into the hook's
process nor with root's privileges: it is opened inside the driver root (no link leads
out, no FIFO blocks, a regular file only) and that very file is loaded by a forked child
that has given up root (ponytail.host.forked_call: nobody, no capabilities, no_new_privs,
every mount read-only in a mount namespace of its own, killed at the deadline).

The answer is cached in ``cuda-version.json`` in the cache directory (``[cache] dir``,
/run/ponytail by default; ``dir = ""``: no cache), keyed by the library file's identity,
so it is asked once per driver. The cache is an input like any other, held to the probe
cache's rules (ponytail.fs.trust): only a regular root file of mode 0600 in a directory
that only root can change is read (without blocking), anything else is ignored with a
note and never believed; an entry that is not a plausible version is ignored (and the
file rewritten), and a write that fails leaves no temporary file.
"""

from __future__ import annotations

import os

from ponytail.errors import ProbeError
from ponytail.fs.hostfiles import under_root
from ponytail.lite.plainjson import loads

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported on the hook's path: for type checkers only
    from typing import TypeGuard

CACHE_FILE = "cuda-version.json"
CACHE_BYTES = 65536
CACHE_ENTRIES = 8  # the most recent libcuda files remembered


def cuda_driver_version(
    driver_root: str, libcuda: str, cache_dir: str, timeout_s: float = 5.0, notes: list[str] | None = None
) -> int:
    """cuDriverGetVersion() of the libcuda at ``libcuda`` (a path inside ``driver_root``),
    asked in an unprivileged child that is killed after ``timeout_s`` seconds. A cache
    file that is not believed is said in ``notes``."""
    from ponytail.fs.inroot import open_file_in_root

    where = under_root(driver_root, libcuda)
    try:
        root_fd = os.open(driver_root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise ProbeError(f"cannot open the driver root {driver_root}: {e.strerror}") from e
    try:
        fd = open_file_in_root(root_fd, libcuda)
    finally:
        os.close(root_fd)
    if fd is None:
        raise ProbeError(f"cannot get the CUDA version from {where}: not a regular file inside {driver_root} (gone, or replaced meanwhile)")
    try:
        st = os.fstat(fd)
        key = f"{os.path.realpath(where)}:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
        entries, writable = _read_cache(cache_dir, notes if notes is not None else [])
        cached = entries.get(key)
        if _plausible(cached):
            return cached
        result = _ask_in_child(fd, where, timeout_s)
    finally:
        os.close(fd)
    if writable:
        _write_cache(os.path.join(cache_dir, CACHE_FILE), _remember(entries, key, result))
    return result


def _ask_in_child(fd: int, where: str, timeout_s: float) -> int:
    from ponytail.host.forked_call import ChildTimeout, run_in_child

    try:
        result = run_in_child(_ask_libcuda, fd, where, timeout_s=timeout_s, unprivileged=True, keep_fds=(fd,))
    except ChildTimeout as e:
        raise ProbeError(
            f"cannot get the CUDA version from {where}: cuDriverGetVersion {e} (a wedged GPU?); "
            "raise [timeouts] probe in the config, or set NVIDIA_DISABLE_REQUIRE=true"
        ) from e
    if not _plausible(result):
        raise ProbeError(f"cannot get the CUDA version from {where}: {result}")
    return result


def _remember(entries: dict, key: str, value: int) -> dict:
    """The cache with ``key`` as its newest entry and at most CACHE_ENTRIES in all, so that a
    few driver roots on one machine (tests, benchmarks, an operator's beside the host's) do
    not evict each other."""
    others = [(k, v) for k, v in entries.items() if k != key][-(CACHE_ENTRIES - 1):]
    return {**dict(others), key: value}


def format_cuda_version(version: int) -> str:
    return f"{version // 1000}.{version % 1000 // 10}"


def _plausible(value: object) -> TypeGuard[int]:
    """A CUDA version as cuDriverGetVersion gives it: 1000 * major + 10 * minor."""
    return type(value) is int and 1000 <= value < 1000000  # not a bool, a float, a string


def _ask_libcuda(fd: int, path: str) -> int | str:
    """In the child: load the file open on ``fd`` (the one that was checked, not a path
    that could lead elsewhere by now) and ask it."""
    import ctypes

    from ponytail.host.forked_call import loadable

    try:
        lib = ctypes.CDLL(loadable(fd, path))
        value = ctypes.c_int(0)
        status = lib.cuDriverGetVersion(ctypes.byref(value))
    except (OSError, AttributeError) as e:
        return str(e)
    return value.value if status == 0 else f"cuDriverGetVersion returned error {status}"


def _read_cache(cache_dir: str, notes: list[str]) -> tuple[dict, bool]:
    """The cache's entries, and whether the cache may be written ({}, False: none, or a
    cache that is not believed, which is said in ``notes``)."""
    from ponytail.fs.trust import Untrusted, open_private_dir, read_private_file

    if not cache_dir:
        return {}, False
    try:
        data = read_private_file(cache_dir, CACHE_FILE, CACHE_BYTES)
    except Untrusted as e:
        notes.append(f"CUDA-version cache ignored: {e} (only a root file of mode 0600 in a directory only root can change is read)")
        try:  # a file of ours gone wrong in a directory of ours is replaced; nothing is written where others can write
            os.close(open_private_dir(cache_dir))
        except (OSError, Untrusted):
            return {}, False
        return {}, True
    if data is None:
        return {}, True
    try:
        entries = loads(data)
    except ValueError:
        return {}, True
    return (entries if isinstance(entries, dict) else {}), True


def _write_cache(path: str, data: dict) -> None:
    """Replace the cache (ponytail.fs.atomic); on any failure (a full /run) nothing is left behind."""
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        import json  # writing: a cache miss only

        from ponytail.fs.atomic import replace_file

        replace_file(path, json.dumps(data).encode(), 0o600)
    except OSError:
        pass  # a cache only: the next run asks again
