"""The CUDA version cache (/run/ponytail): several driver roots on one machine do not
evict each other, and a changed libcuda is asked again, never served stale."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ponytail.host.cuda import CACHE_ENTRIES, cuda_driver_version

from support.fakehost import LIB_DIR, FakeHost, compile_library


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
