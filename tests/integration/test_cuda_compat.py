"""CUDA forward compatibility: an image's newer libcuda under /usr/local/cuda/compat is put
first; an older one is not, and an image's own stale libcuda still never shadows the
injected driver. The fake host's libcuda reports CUDA 12.4 (driver 550.54.15)."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.engines import hook_entry, oci_bundle, run_bundle
from support.fakehost import FakeHost, add_cuda_compat, add_stale_libcuda, gpus, make_rootfs
from support.harness import bundle_for, run_ponytail, state_for

NEWER = ("570.86.10", 12080)
OLDER = ("535.104.05", 12020)
CHECK = ["/usr/local/bin/cudacheck"]


HOST_SHAPE = {"gpu_list": gpus(1)}  # host's


def _run_container(host: FakeHost, tmp_path: Path, env: list[str] = (), config: Path | None = None, prepare=None) -> list[str]:  # type: ignore[assignment]
    hooks = {"prestart": [hook_entry(config or host.write_config())]}
    bundle = oci_bundle(tmp_path, CHECK, env=["NVIDIA_VISIBLE_DEVICES=0", *env], hooks=hooks)
    if prepare is not None:
        prepare(bundle / "rootfs")
    result = run_bundle("runc", bundle)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def _debug(host: FakeHost, tmp_path: Path, rootfs: Path, env: list[str] = (), config: Path | None = None) -> str:  # type: ignore[assignment]
    bundle = bundle_for(tmp_path, rootfs, env=["PATH=/bin", *env])
    result = run_ponytail(["-config", str(config or host.write_config()), "-debug"], stdin=state_for(bundle, 1))
    out = result.stdout.decode()
    assert result.returncode == (1 if "a real run would FAIL" in out else 0), result.stderr  # a dry run exits as the real run would
    return out


def test_a_newer_compat_libcuda_is_what_the_container_loads(host: FakeHost, tmp_path: Path) -> None:
    out = _run_container(host, tmp_path, prepare=lambda rootfs: add_cuda_compat(rootfs, *NEWER))
    assert out == ["cuDriverGetVersion 12080"]
    assert "CUDA compat /usr/local/cuda/compat: used, its libcuda 570.86.10 is newer" in host.log.read_text()


def _older_compat_in_the_linker_path(rootfs: Path) -> None:
    """An older compat directory the image itself lists first in its ld.so.conf."""
    add_cuda_compat(rootfs, *OLDER)
    (rootfs / "etc/ld.so.conf.d").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc/ld.so.conf.d/000-cuda-compat.conf").write_text("/usr/local/cuda/compat\n")


@pytest.mark.parametrize("listed", [False, True])
def test_an_older_compat_libcuda_is_not_used(host: FakeHost, tmp_path: Path, listed: bool) -> None:
    prepare = _older_compat_in_the_linker_path if listed else (lambda rootfs: add_cuda_compat(rootfs, *OLDER))
    out = _run_container(host, tmp_path, prepare=prepare)
    assert out == ["cuDriverGetVersion 12040"]
    rootfs = make_rootfs(tmp_path / "older")
    add_cuda_compat(rootfs, *OLDER)
    assert "CUDA compat /usr/local/cuda/compat: not used, its libcuda 535.104.05 is not a newer major" in _debug(host, tmp_path, rootfs)


def test_the_container_can_opt_out(host: FakeHost, tmp_path: Path) -> None:
    out = _run_container(host, tmp_path, env=["PONYTAIL_DISABLE_CUDA_COMPAT=true"], prepare=lambda rootfs: add_cuda_compat(rootfs, *NEWER))
    assert out == ["cuDriverGetVersion 12040"]


def test_the_admin_can_turn_it_off(host: FakeHost, tmp_path: Path) -> None:
    config = host.write_config()
    config.write_text(config.read_text() + "[cuda]\ncompat = false\n")
    rootfs = make_rootfs(tmp_path / "img")
    add_cuda_compat(rootfs, *NEWER)
    assert "not used, [cuda] compat = false" in _debug(host, tmp_path, rootfs, config=config)


def test_the_cuda_requirement_uses_the_libcuda_the_container_will_load(host: FakeHost, tmp_path: Path) -> None:
    require = ["NVIDIA_REQUIRE_CUDA=cuda>=12.8"]
    plain = make_rootfs(tmp_path / "plain")
    assert "problem: this host does not meet NVIDIA_REQUIRE_CUDA='cuda>=12.8'" in _debug(host, tmp_path, plain, require)
    compat = make_rootfs(tmp_path / "compat")
    add_cuda_compat(compat, *NEWER)
    out = _debug(host, tmp_path, compat, require)
    assert "problem:" not in out and "CUDA compat /usr/local/cuda/compat: used" in out
    assert "/usr/local/cuda/compat first" in out


def test_a_stale_libcuda_in_the_image_still_loses(host: FakeHost, tmp_path: Path) -> None:
    out = _run_container(host, tmp_path, prepare=lambda rootfs: add_stale_libcuda(rootfs, "470.82.01", 11040))
    assert out == ["cuDriverGetVersion 12040"]


def test_a_stale_libcuda_and_a_newer_compat_directory(host: FakeHost, tmp_path: Path) -> None:
    def prepare(rootfs: Path) -> None:
        add_stale_libcuda(rootfs, "470.82.01", 11040)
        add_cuda_compat(rootfs, *NEWER)

    assert _run_container(host, tmp_path, prepare=prepare) == ["cuDriverGetVersion 12080"]


@pytest.mark.parametrize("relative", [False, True])
def test_a_compat_link_out_of_the_rootfs_is_not_followed(host: FakeHost, tmp_path: Path, relative: bool) -> None:
    """/usr/local/cuda/compat -> a host directory holding a newer libcuda: resolved inside
    the rootfs, where it leads nowhere, so the host's directory is never used."""
    outside = add_cuda_compat(tmp_path / "outside", *NEWER)

    def prepare(rootfs: Path) -> None:
        link = rootfs / "usr/local/cuda/compat"
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to("../../../../../../../../.." + str(outside) if relative else str(outside))

    assert _run_container(host, tmp_path, prepare=prepare) == ["cuDriverGetVersion 12040"]
    rootfs = make_rootfs(tmp_path / "img")
    prepare(rootfs)
    out = _debug(host, tmp_path, rootfs)
    assert "CUDA compat" not in out and str(outside) not in out


def test_compat_behind_the_usual_cuda_link(host: FakeHost, tmp_path: Path) -> None:
    """nvidia/cuda images: /usr/local/cuda -> cuda-12.8, the compat files in cuda-12.8/compat."""
    def prepare(rootfs: Path) -> None:
        add_cuda_compat(rootfs, *NEWER, directory="/usr/local/cuda-12.8/compat")
        (rootfs / "usr/local/cuda").symlink_to("cuda-12.8")

    assert _run_container(host, tmp_path, prepare=prepare) == ["cuDriverGetVersion 12080"]


@pytest.mark.parametrize("plant", ["fifo", "garbage", "dangling", "dir-link", "absolute-link"])
def test_hostile_compat_files_are_not_used(host: FakeHost, tmp_path: Path, plant: str) -> None:
    """A libcuda.so.1 in the compat directory that is a FIFO, not ELF, dangling, a link
    through a directory or to an absolute path: never read as a driver, never a hang."""
    import os

    rootfs = make_rootfs(tmp_path / "img")
    compat = rootfs / "usr/local/cuda/compat"
    compat.mkdir(parents=True)
    if plant == "fifo":
        os.mkfifo(compat / "libcuda.so.570.86.10")
        (compat / "libcuda.so.1").symlink_to("libcuda.so.570.86.10")
    elif plant == "garbage":
        (compat / "libcuda.so.570.86.10").write_bytes(b"\x7fELF" + b"\xff" * 60)
        (compat / "libcuda.so.1").symlink_to("libcuda.so.570.86.10")
    elif plant == "dangling":
        (compat / "libcuda.so.1").symlink_to("libcuda.so.570.86.10")
    elif plant == "dir-link":
        add_cuda_compat(rootfs, *NEWER, directory="/opt/real")
        (compat / "libcuda.so.1").symlink_to("../../../../opt/real/libcuda.so.570.86.10")
    else:
        outside = add_cuda_compat(tmp_path / "outside", *NEWER)
        (compat / "libcuda.so.1").symlink_to(outside / "libcuda.so.570.86.10")
    out = _debug(host, tmp_path, rootfs)
    assert "CUDA compat /usr/local/cuda/compat: not used" in out and "has no libcuda.so.X.Y.Z" in out
