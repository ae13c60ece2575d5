"""ponytail.fs.kernelfs reads statfs through a structure with named fields: each agrees with what
os.statvfs and stat(1) report for the same filesystem."""

from __future__ import annotations

import os
import subprocess

import pytest

from ponytail.fs.kernelfs import KERNEL_FS_MAGIC, fstatfs, kernel_filesystem

PATHS = ["/", "/tmp", "/proc", "/sys", "/dev", "/dev/pts", "/dev/shm", "/sys/fs/cgroup", "/run"]


@pytest.mark.parametrize("path", [p for p in PATHS if os.path.isdir(p)])
def test_statfs_fields_agree_with_statvfs_and_stat(path: str) -> None:
    fd = os.open(path, os.O_PATH | os.O_DIRECTORY)
    try:
        ours, theirs = fstatfs(fd), os.statvfs(path)
        kind = kernel_filesystem(fd)
    finally:
        os.close(fd)
    assert (ours.f_bsize, ours.f_frsize, ours.f_namelen) == (theirs.f_bsize, theirs.f_frsize, theirs.f_namemax)
    if path not in ("/", "/tmp", "/run"):  # counts of a busy disk change between two calls
        assert (ours.f_blocks, ours.f_files, ours.f_ffree) == (theirs.f_blocks, theirs.f_files, theirs.f_ffree)
    f_type = int(subprocess.run(["stat", "-f", "-c", "%t", path], capture_output=True, text=True, check=True).stdout, 16)
    assert ours.f_type & 0xFFFFFFFF == f_type
    assert kind == KERNEL_FS_MAGIC.get(f_type)
