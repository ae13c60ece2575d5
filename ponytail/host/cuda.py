"""The CUDA version the driver supports: what its libcuda's cuDriverGetVersion returns
(12040 means 12.4). That call needs no cuInit and opens no GPU; it runs in a forked
child so libcuda never lives in the hook's process. The answer is cached in
/run/ponytail, keyed by the library file's identity, so it is asked once per driver.
The cache is an input like any other: an entry that is not a plausible version is
ignored (and the file rewritten), and a write that fails leaves no temporary file.
"""

from __future__ import annotations

import os

from ponytail.errors import ProbeError
from ponytail.lite.plainjson import loads

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported on the hook's path: for type checkers only
    from typing import TypeGuard

CACHE_DIR = "/run/ponytail"
CACHE_ENTRIES = 8  # the most recent libcuda files remembered


def cuda_driver_version(libcuda: str, cache_dir: str = CACHE_DIR, timeout_s: float = 5.0) -> int:
    """cuDriverGetVersion() of the libcuda at ``libcuda`` (a host path), asked in a child
    that is killed after ``timeout_s`` seconds."""
    try:
        st = os.stat(libcuda)
    except OSError as e:
        raise ProbeError(f"cannot read {libcuda}: {e.strerror}") from e
    key = f"{os.path.realpath(libcuda)}:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
    cache_file = os.path.join(cache_dir, "cuda-version.json")
    cached = _read_cache(cache_file).get(key)
    if _plausible(cached):
        return cached
    from ponytail.host.child import ChildTimeout, run_in_child

    try:
        result = run_in_child(_ask_libcuda, libcuda, timeout_s=timeout_s)
    except ChildTimeout as e:
        raise ProbeError(
            f"cannot get the CUDA version from {libcuda}: cuDriverGetVersion {e} (a wedged GPU?); "
            "raise [timeouts] probe in the config, or set NVIDIA_DISABLE_REQUIRE=true"
        ) from e
    if not _plausible(result):
        raise ProbeError(f"cannot get the CUDA version from {libcuda}: {result}")
    try:
        after = os.stat(libcuda)
    except OSError:
        after = None
    if after is None or (after.st_dev, after.st_ino, after.st_size, after.st_mtime_ns) != (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns):
        # the child may have loaded another file than the one the key names: neither trusted nor remembered
        raise ProbeError(f"{libcuda} on the host was replaced while its CUDA version was asked (a driver being installed?); try again")
    _write_cache(cache_file, _remember(_read_cache(cache_file), key, result))
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


def _ask_libcuda(path: str) -> int | str:
    import ctypes

    try:
        lib = ctypes.CDLL(path)
        value = ctypes.c_int(0)
        status = lib.cuDriverGetVersion(ctypes.byref(value))
    except (OSError, AttributeError) as e:
        return str(e)
    return value.value if status == 0 else f"cuDriverGetVersion returned error {status}"


def _read_cache(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            data = loads(f.read(65536))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_cache(path: str, data: dict) -> None:
    """Replace the cache; on any failure (a full /run) remove what was begun."""
    tmp = f"{path}.{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        import json  # writing: a cache miss only

        content = json.dumps(data).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            if os.write(fd, content) != len(content):
                raise OSError("short write")
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass  # a cache only: the next run asks again
