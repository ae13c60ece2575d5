"""The CUDA version cache (cuda-version.json in [cache] dir, /run/ponytail by default):
several driver roots on one machine do not evict each other, a changed libcuda is asked
again, never served stale; the configured directory is the one used (none when empty),
and a file there that someone else could have written, or a FIFO, is ignored with a
warning, never believed, and never blocks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ponytail.host.cuda import CACHE_ENTRIES, cuda_driver_version

from support.commands import PONYTAIL, shell
from support.fakehost import LIB_DIR, FakeHost, compile_library, make_rootfs
from support.harness import bundle_for, in_private_mount_ns, state_for


def ask(host: FakeHost, cache: str) -> int:
    return cuda_driver_version(str(host.driver), f"{LIB_DIR}/libcuda.so.1", cache)


def test_two_driver_roots_are_both_remembered(tmp_path: Path) -> None:
    a = FakeHost(tmp_path / "a", cuda_version=12040)
    b = FakeHost(tmp_path / "b", cuda_version=12020)
    cache = tmp_path / "cache"
    assert ask(a, str(cache)) == 12040
    assert ask(b, str(cache)) == 12020
    entries = json.loads((cache / "cuda-version.json").read_text())
    assert sorted(entries.values()) == [12020, 12040]
    assert ask(a, str(cache)) == 12040  # from the cache, still right


def test_a_replaced_libcuda_is_asked_again(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "host", cuda_version=12040)
    cache = str(tmp_path / "cache")
    assert ask(host, cache) == 12040
    newer = compile_library("fake_libcuda.c", "libcuda.so.1", f"libcuda.so.{host.driver_version}", host.driver_version, 12080)
    target = host.driver / LIB_DIR.lstrip("/") / f"libcuda.so.{host.driver_version}"
    target.unlink()
    shutil.copy(newer, target)  # a driver update in place: a new file at the same path
    assert ask(host, cache) == 12080


def test_a_libcuda_rewritten_in_place_with_its_mtime_restored_is_asked_again(tmp_path: Path) -> None:
    """cp over the file then touch -r (what rsync or a package tool may do): the same path, device,
    inode, size and mtime; only the ctime says the content changed."""
    host = FakeHost(tmp_path / "host", cuda_version=12040)
    cache = str(tmp_path / "cache")
    assert ask(host, cache) == 12040
    target = host.driver / LIB_DIR.lstrip("/") / f"libcuda.so.{host.driver_version}"
    older = compile_library("fake_libcuda.c", "libcuda.so.1", f"libcuda.so.{host.driver_version}", host.driver_version, 11000)
    before = target.stat()
    assert older.stat().st_size == before.st_size  # the same size: only the version constant differs
    with open(target, "r+b") as f:  # in place: the same inode
        f.write(older.read_bytes())
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = target.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    assert ask(host, cache) == 11000


def test_the_cache_stays_small(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    old = {f"/gone/libcuda.so.{i}:1:{i}:1:1": 11000 + i for i in range(3 * CACHE_ENTRIES)}
    (cache / "cuda-version.json").write_text(json.dumps(old))
    (cache / "cuda-version.json").chmod(0o600)
    host = FakeHost(tmp_path / "host")
    assert ask(host, str(cache)) == 12040
    entries = json.loads((cache / "cuda-version.json").read_text())
    assert len(entries) == CACHE_ENTRIES and 12040 in entries.values()


# -- the cache as an input: [cache] dir, owner and mode, no blocking open ----------------------


def hook_with_private_run(host: FakeHost, tmp_path: Path, cache_dir: str, setup: str, requirement: str = "cuda>=12.0") -> subprocess.CompletedProcess:
    """The hook's -debug run for a container requiring ``requirement``, with ``[cache] dir =
    cache_dir``, in a mount namespace of its own whose /run is a fresh tmpfs prepared by
    ``setup`` (bash); prints rc=, the run's output, then what /run/ponytail holds."""
    bundle = bundle_for(tmp_path, make_rootfs(tmp_path / "rootfs"), env=["PATH=/bin", f"NVIDIA_REQUIRE_CUDA={requirement}"])
    state = tmp_path / "state.json"
    state.write_text(state_for(bundle, os.getpid()))
    config = host.write_config()
    config.write_text(config.read_text().replace(f'dir = "{host.base}/cache"', f"dir = {json.dumps(cache_dir)}"))
    run = f"rc=0; timeout 30 {shell(PONYTAIL)} -config {config} -debug < {state} || rc=$?; echo rc=$rc"
    return in_private_mount_ns(f"mount -t tmpfs tmpfs /run\nmkdir /run/ponytail\n{setup}\n{run}\necho /run/ponytail:; ls -A /run/ponytail")


def test_the_configured_cache_dir_is_used_and_an_empty_one_turns_the_cache_off(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "host")
    elsewhere = tmp_path / "elsewhere"
    result = hook_with_private_run(host, tmp_path, str(elsewhere), "")
    assert "rc=0" in result.stdout and result.stdout.endswith("/run/ponytail:\n"), result  # before: /run/ponytail was written
    assert json.loads((elsewhere / "cuda-version.json").read_text()) == {key(host): 12040}
    shutil.rmtree(elsewhere)
    result = hook_with_private_run(host, tmp_path, "", "")
    assert "rc=0" in result.stdout and result.stdout.endswith("/run/ponytail:\n"), result
    assert not elsewhere.exists()


def key(host: FakeHost) -> str:
    """The cache's key for the fake host's libcuda: its real path and its identity."""
    path = host.driver / LIB_DIR.lstrip("/") / f"libcuda.so.{host.driver_version}"
    st = path.stat()
    return f"{os.path.realpath(path)}:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


# how a cache file claiming CUDA 99.0 gets there: (directory mode, file owner, file mode); "link": a link to such a file
PLANTED = {
    "a user's file in a world-writable directory": ("1777", "1000", "600"),
    "a user's file in root's directory": ("700", "1000", "600"),
    "root's file that others may read": ("700", "0", "644"),
    "root's file in a world-writable directory": ("1777", "0", "600"),
    "a link to root's file elsewhere": ("700", "link", "600"),
}


@pytest.mark.parametrize("case", [*PLANTED, "root's file in root's directory"])
def test_a_cache_file_someone_else_could_have_written_is_never_believed(tmp_path: Path, case: str) -> None:
    host = FakeHost(tmp_path / "host")
    claim = tmp_path / "claim.json"
    claim.write_text(json.dumps({key(host): 99000}))
    directory, owner, mode = PLANTED.get(case, ("700", "0", "600"))
    target = "/run/ponytail/cuda-version.json"
    if owner == "link":
        plant = f"install -m {mode} {claim} /run/claim.json && ln -s /run/claim.json {target}"
    else:
        plant = f"install -m {mode} -o {owner} {claim} {target}"
    result = hook_with_private_run(host, tmp_path, "/run/ponytail", f"chmod {directory} /run/ponytail && {plant}", "cuda>=99.0")
    if case not in PLANTED:  # the cache is read: the planted claim is what a cache of root's says
        assert "rc=0" in result.stdout and "problem" not in result.stdout, result.stdout
        return
    assert "rc=1" in result.stdout, result  # a dry run exits as the real run would: cuda>=99.0 is not met
    assert "problem: " in result.stdout and "99.0" in result.stdout, result.stdout  # before: 'met' by the planted file
    assert "warning: CUDA-version cache ignored: " in result.stdout, result.stdout


def test_a_fifo_as_the_cache_is_ignored_and_never_hangs_the_hook(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "host")
    result = hook_with_private_run(host, tmp_path, "/run/ponytail", "chmod 700 /run/ponytail && mkfifo -m 600 /run/ponytail/cuda-version.json")
    assert "rc=0" in result.stdout, result  # before: rc=124, blocked in open() until killed
    assert "warning: CUDA-version cache ignored: /run/ponytail/cuda-version.json" in result.stdout, result.stdout
    assert "problem" not in result.stdout  # the answer came from libcuda: CUDA 12.4 meets cuda>=12.0
