"""Library globs find what a full fnmatch pass over the directory and the ld.so.cache finds."""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

import pytest

from ponytail.host.driver_files import LibrarySearch, find_libraries
from ponytail.host.ldcache import read_ld_cache

from support.fakehost import LIB_DIR, FakeHost, gpus

HOST_SHAPE = {"gpu_list": gpus(1), "lib_dir": "/usr/local/nvidia/lib64"}  # shared_host's


@pytest.fixture(scope="module")
def lookalike_host(shared_host: FakeHost) -> FakeHost:
    """shared_host with files beside its libraries whose names look like theirs."""
    libdir = shared_host.driver / LIB_DIR.lstrip("/")
    libdir.mkdir(parents=True)
    for name in ("libcudart.so.12", "libnvidia-egl-wayland.so.1", "libcuda.so.1.bak", "libacuda.so.1", "libcuda.so"):
        (libdir / name).write_bytes(b"not a library")
    return shared_host


@pytest.mark.parametrize(
    "name_pattern",
    ["libcuda.so.*", "libcuda*", "*cuda.so.*", "lib?uda.so.[0-9]*", "libnvidia-*.so.*", "libcuda.so.[!0-9]*", "*", "libcuda.so"],
)
@pytest.mark.parametrize("directory", [LIB_DIR, "/usr/local/nvidia/lib64"])
def test_a_glob_matches_exactly_what_fnmatch_matches(lookalike_host: FakeHost, directory: str, name_pattern: str) -> None:
    search = LibrarySearch.for_glob(f"{directory}/{name_pattern}", "a test")
    _, reports, _ = find_libraries(str(lookalike_host.driver), [search], lookalike_host.driver_version)
    names = os.listdir(lookalike_host.driver / directory.lstrip("/"))
    matches = tuple(f"{directory}/{n}" for n in sorted(fnmatch.filter(names, name_pattern)))
    assert reports[0].matches == matches
    cache = read_ld_cache(str(lookalike_host.driver / "etc/ld.so.cache"))
    expected = sorted({p for n, p in cache if fnmatch.fnmatchcase(n, name_pattern) and p not in matches})
    assert list(reports[0].from_cache) == expected


def test_one_listing_per_directory(lookalike_host: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    listed: list[str] = []
    real_listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda path: listed.append(str(path)) or real_listdir(path))
    searches = [LibrarySearch.for_name(stem, "a test") for stem in ("libcuda", "libnvidia-ml", "libnvidia-cfg")]
    found, _, _ = find_libraries(str(lookalike_host.driver), searches, lookalike_host.driver_version)
    assert str(Path(lookalike_host.driver) / "usr/local/nvidia/lib64") in listed
    assert sorted(listed) == sorted(set(listed)), "a directory was listed twice"
    assert {f.soname for f in found} == {"libcuda.so.1", "libnvidia-ml.so.1"}


def test_a_glob_in_the_directory_part(lookalike_host: FakeHost) -> None:
    plain = LibrarySearch.for_glob("/usr/local/nvidia/lib64/libcuda.so.*", "a test")
    dirglob = LibrarySearch.for_glob("/usr/local/*/lib6?/libcuda.so.*", "a test")
    plain, dirglob = (find_libraries(str(lookalike_host.driver), [s], lookalike_host.driver_version)[1][0] for s in (plain, dirglob))
    assert dirglob.matches == plain.matches and plain.matches


def test_candidates_resolve_as_real_path_in_root_does(tmp_path: Path) -> None:
    from ponytail.fs.inroot import real_path_in_root
    from ponytail.host.driver_files import _real_path, _Scan

    root = tmp_path / "root"
    lib = root / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (root / "lib").symlink_to("usr/lib")
    (lib / "libcuda.so.550.54.15").write_bytes(b"x")
    (lib / "libcuda.so.1").symlink_to("libcuda.so.550.54.15")
    (lib / "abs.so.1").symlink_to("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15")
    (lib / "out.so.1").symlink_to("../../../../../../etc/hostname")
    (lib / "dangling.so.1").symlink_to("nowhere.so")
    (lib / "subdir").mkdir()
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        scan = _Scan(str(root), fd, "550.54.15", [])
        names = ["libcuda.so.550.54.15", "libcuda.so.1", "abs.so.1", "out.so.1", "dangling.so.1", "subdir", "missing.so", "..", "."]
        for directory in ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/lib/../lib/x86_64-linux-gnu", "/nope"):
            for name in names:
                path = f"{directory}/{name}"
                assert _real_path(scan, path) == real_path_in_root(fd, path), path
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("path", "version", "driver"),
    [
        ("/usr/lib/libcuda.so.550.54.15", "550.54.15", True),
        ("/usr/lib/libnvidia-ml.so.390.157", "390.157", True),
        ("/usr/lib/libcuda.so.1", None, False),
        ("/usr/lib/libfoo.so.1.2", "1.2", False),
        ("/usr/lib/libfoo.so.1.2.3.4", "1.2.3.4", False),
        ("/usr/lib/libcuda.so.1.so.550.54.15", "550.54.15", True),
        ("/usr/lib/libcuda.so.550.54.15.bak", None, False),
        ("/usr/lib/libcuda.so.550..15", None, False),
        ("/usr/lib/libcuda.so.", None, False),
        ("/usr/lib/x.so.1.2/libcuda.so", None, False),
        ("/usr/lib/libcuda.so.٥٥٠.54.15", "٥٥٠.54.15", True),  # \d took any decimal digit
    ],
)
def test_the_version_in_a_library_name(path: str, version: str | None, driver: bool) -> None:
    r"""What r'\.so\.(\d+(?:\.\d+)+)$' and, on it, r'^\d{3,}\.\d+(\.\d+)?$' said."""
    from ponytail.host.driver_files import _driver_like, _library_version

    assert _library_version(path) == version
    assert (version is not None and _driver_like(version)) == driver
