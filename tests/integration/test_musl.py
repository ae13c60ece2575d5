"""Images that are not glibc-based: musl's loader reads no ld.so.cache, so an Alpine image finds
the injected libcuda.so.1 only through /etc/ld-musl-<arch>.path, which ponytail writes when the
image has a musl loader (with the same in-root protections as every file it writes there)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support.commands import PONYTAIL, shell
from support.fakehost import MUSL_LIBC, FakeHost, make_musl_rootfs
from support.harness import in_private_mount_ns, run_ponytail

pytestmark = pytest.mark.skipif(not MUSL_LIBC.exists(), reason="Debian's musl and musl-tools packages are not installed")
PATH_FILE = "etc/ld-musl-x86_64.path"
LIB_DIR = "/usr/lib/x86_64-linux-gnu"


def test_a_musl_image_loads_the_injected_libcuda(host: FakeHost, tmp_path: Path) -> None:
    rootfs = make_musl_rootfs(tmp_path / "alpine", path_file="/opt/own/lib\n/usr/lib\n")
    result = in_private_mount_ns(
        f"""
        chroot {rootfs} /usr/local/bin/cudacheck || true
        {shell(PONYTAIL)} -config {host.write_config()} -root {rootfs} -device 0
        chroot {rootfs} /usr/local/bin/cudacheck /dev/nvidia2
        """
    )
    assert result.returncode == 0, result.stderr
    before, after = result.stdout.split("\n", 1)
    assert before.startswith("dlopen libcuda.so.1 failed"), result.stdout  # the image alone: not on musl's path
    assert "cuDriverGetVersion 12040" in after and "open /dev/nvidia2 ENXIO" in after, result.stdout
    # the injected directory first, the image's own entries kept, musl's defaults after them
    assert (rootfs / PATH_FILE).read_text() == f"{LIB_DIR}\n/opt/own/lib\n/usr/lib\n/lib\n/usr/local/lib\n"


def test_a_musl_image_without_a_path_file_gets_one_with_the_defaults(host: FakeHost, tmp_path: Path) -> None:
    rootfs = make_musl_rootfs(tmp_path / "alpine")
    result = in_private_mount_ns(f"{shell(PONYTAIL)} -config {host.write_config()} -root {rootfs} -device 0")
    assert result.returncode == 0, result.stderr
    assert (rootfs / PATH_FILE).read_text() == f"{LIB_DIR}\n/lib\n/usr/local/lib\n/usr/lib\n"
    again = in_private_mount_ns(f"{shell(PONYTAIL)} -config {host.write_config()} -root {rootfs} -device 0")
    assert again.returncode == 0, again.stderr
    assert (rootfs / PATH_FILE).read_text() == f"{LIB_DIR}\n/lib\n/usr/local/lib\n/usr/lib\n"  # not doubled


def test_a_glibc_image_gets_no_musl_path_file(host: FakeHost, rootfs: Path) -> None:
    result = in_private_mount_ns(f"{shell(PONYTAIL)} -config {host.write_config()} -root {rootfs} -device 0")
    assert result.returncode == 0, result.stderr
    assert not list((rootfs / "etc").glob("ld-musl-*"))


def test_a_path_file_planted_as_a_link_out_of_the_rootfs_is_written_inside_it(host: FakeHost, tmp_path: Path) -> None:
    rootfs = make_musl_rootfs(tmp_path / "alpine")
    outside = tmp_path / "outside.path"
    outside.write_text("host file\n")
    os.symlink(f"../../../../../../..{outside}", rootfs / PATH_FILE)
    result = in_private_mount_ns(f"{shell(PONYTAIL)} -config {host.write_config()} -root {rootfs} -device 0")
    assert result.returncode == 0, result.stderr
    assert outside.read_text() == "host file\n"
    inside = rootfs / str(outside).lstrip("/")
    assert inside.read_text().startswith(f"{LIB_DIR}\n"), "the link is followed inside the rootfs only"


def test_a_path_file_planted_as_a_fifo_is_neither_opened_nor_written(host: FakeHost, tmp_path: Path) -> None:
    rootfs = make_musl_rootfs(tmp_path / "alpine")
    os.mkfifo(rootfs / PATH_FILE)
    result = run_ponytail(["-config", str(host.write_config()), "-root", str(rootfs), "-device", "0"])
    assert result.returncode == 1
    lines = result.stderr.decode().splitlines()
    assert len(lines) == 1 and "/etc/ld-musl-x86_64.path in the rootfs is not a regular file" in lines[0], lines
