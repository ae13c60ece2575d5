"""A hook run (hook mode and manual mode, through the installed console script) imports none of
the modules whose import would weigh on every container start: dataclasses, tomllib, subprocess,
typing, click. Their stand-ins are in ponytail/lite/ (its README.md); bench/ has the numbers."""

from __future__ import annotations

from pathlib import Path

from support.engines import console_script
from support.fakehost import FakeHost, make_rootfs
from support.harness import bundle_for, in_private_mount_ns, mounts_under, run_ponytail, state_for

HEAVY = {"dataclasses", "tomllib", "tomli", "subprocess", "typing", "click"}


def imported(importtime_stderr: str) -> set[str]:
    """The top-level packages in ``python -X importtime``'s report (PYTHONPROFILEIMPORTTIME)."""
    names = set()
    for line in importtime_stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "imported package" not in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


def test_a_hook_mode_run_imports_no_heavy_module(host: FakeHost, tmp_path: Path, sleeper) -> None:
    rootfs = make_rootfs(tmp_path / "bundle" / "rootfs")
    # a CUDA requirement: the CUDA version is asked of libcuda in a child process (ponytail.host.child)
    bundle = bundle_for(tmp_path, rootfs, env=["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_CUDA=cuda>=12.0"])
    result = run_ponytail(
        ["-config", str(host.write_config())], stdin=state_for(bundle, sleeper.pid),
        env={"PYTHONPROFILEIMPORTTIME": "1"}, command=[console_script("ponytail")],
    )
    err = result.stderr.decode()
    assert result.returncode == 0, err
    inside = sleeper.run(["chroot", str(rootfs), "/usr/local/bin/cudacheck", "/dev/nvidia2"])
    assert "cuDriverGetVersion 12040" in inside.stdout, inside.stdout + inside.stderr
    modules = imported(err)
    assert "ponytail" in modules and not modules & HEAVY, sorted(modules & HEAVY)


def test_a_manual_mode_run_imports_no_heavy_module(host: FakeHost, rootfs: Path) -> None:
    result = in_private_mount_ns(
        f"""
        PYTHONPROFILEIMPORTTIME=1 {console_script("ponytail")} -config {host.write_config()} -root {rootfs} -device 0
        chroot {rootfs} /usr/local/bin/cudacheck /dev/nvidia2
        """
    )
    assert result.returncode == 0, result.stderr
    assert "cuDriverGetVersion 12040" in result.stdout
    modules = imported(result.stderr)
    assert "ponytail" in modules and not modules & HEAVY, sorted(modules & HEAVY)
    assert mounts_under(rootfs) == []
