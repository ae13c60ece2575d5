"""A hook run (hook mode and manual mode, through the installed console script) imports none of
the modules whose import would weigh on every container start: dataclasses, tomllib, subprocess,
typing, click; and once the probe cache is warm (every start but a host's first), not json, re,
enum, glob or fnmatch either. Their stand-ins are in ponytail/lite/ (its README.md); bench/ has
the numbers."""

from __future__ import annotations

from pathlib import Path

from support.engines import console_script
from support.fakehost import FakeHost, make_rootfs
from support.harness import Sleeper, bundle_for, in_private_mount_ns, mounts_under, run_ponytail, state_for

HEAVY = {"dataclasses", "tomllib", "tomli", "subprocess", "typing", "click"}
# json's decoder imports re, and re imports enum: ~10 ms. A warm start reads the OCI state and config.json
# with ponytail.lite.plainjson and the requirements without re; glob and fnmatch serve the driver-root search
# (a probe cache miss), json writes the CUDA version's cache (once).
WARM = HEAVY | {"json", "re", "enum", "glob", "fnmatch"}


def imported(importtime_stderr: str) -> set[str]:
    """The top-level packages in ``python -X importtime``'s report (PYTHONPROFILEIMPORTTIME)."""
    names = set()
    for line in importtime_stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "imported package" not in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


def test_a_hook_mode_run_imports_no_heavy_module(host: FakeHost, tmp_path: Path, sleeper) -> None:
    # a CUDA requirement: the CUDA version is asked of libcuda in a child process (ponytail.host.forked_call)
    env = ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_CUDA=cuda>=12.0 brand=tesla,driver>=470"]
    config = host.write_config()
    first = Sleeper()
    try:  # the host's first start: the probe cache and the CUDA version's cache are written
        cold = bundle_for(tmp_path / "cold", make_rootfs(tmp_path / "cold" / "bundle" / "rootfs"), env=env)
        result = run_ponytail(["-config", str(config)], stdin=state_for(cold, first.pid),
                              env={"PYTHONPROFILEIMPORTTIME": "1"}, command=[console_script("ponytail")])
        assert result.returncode == 0, result.stderr.decode()
        assert "ponytail" in imported(result.stderr.decode()) and not imported(result.stderr.decode()) & HEAVY
    finally:
        first.stop()
    rootfs = make_rootfs(tmp_path / "bundle" / "rootfs")
    bundle = bundle_for(tmp_path, rootfs, env=env)
    result = run_ponytail(
        ["-config", str(config)], stdin=state_for(bundle, sleeper.pid),
        env={"PYTHONPROFILEIMPORTTIME": "1"}, command=[console_script("ponytail")],
    )
    err = result.stderr.decode()
    assert result.returncode == 0, err
    inside = sleeper.run(["chroot", str(rootfs), "/usr/local/bin/cudacheck", "/dev/nvidia2"])
    assert "cuDriverGetVersion 12040" in inside.stdout, inside.stdout + inside.stderr
    modules = imported(err)
    assert "ponytail" in modules and not modules & WARM, sorted(modules & WARM)
    # nor what only the driver's own file list (absent here) needs; the atomic writer (ponytail.fs.atomic, which
    # imports nothing new) writes the container's record for ponytail guard, and nothing else on a warm start
    submodules = {line.rsplit("|", 1)[1].strip() for line in err.splitlines() if line.startswith("import time:") and "|" in line}
    assert "ponytail.host.filelist" not in submodules
    assert ("ponytail.fs.atomic" in submodules) == any((host.base / "cache" / "containers").glob("*.json"))


def test_a_manual_mode_run_imports_no_heavy_module(host: FakeHost, rootfs: Path, tmp_path: Path) -> None:
    warm = make_rootfs(tmp_path / "warm")
    command = f"{console_script('ponytail')} -config {host.write_config()} -device 0"
    result = in_private_mount_ns(
        f"""
        PYTHONPROFILEIMPORTTIME=1 {command} -root {rootfs} 2>/dev/null
        PYTHONPROFILEIMPORTTIME=1 {command} -root {warm}
        chroot {warm} /usr/local/bin/cudacheck /dev/nvidia2
        """
    )
    assert result.returncode == 0, result.stderr
    assert "cuDriverGetVersion 12040" in result.stdout
    modules = imported(result.stderr)
    assert "ponytail" in modules and not modules & WARM, sorted(modules & WARM)
    assert "ponytail.fs.atomic" not in result.stderr  # no container, no record: nothing written on a warm start
    assert mounts_under(rootfs) == [] and mounts_under(warm) == []
