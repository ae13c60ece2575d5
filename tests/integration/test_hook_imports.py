"""A hook run (hook mode and manual mode, through the installed console script) imports none of
the modules whose import would weigh on every container start: dataclasses, tomllib, subprocess,
typing, click; and once the probe cache is warm (every start but a host's first), not json, re,
enum, glob or fnmatch either. Their stand-ins are in ponytail/lite/ (its README.md); bench/ has
the numbers."""

from __future__ import annotations

import json
import os
import subprocess
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


def test_nvidias_hooks_served_by_ponytail_import_no_heavy_module(host: FakeHost, tmp_path: Path) -> None:
    """The first of NVIDIA's spec's hooks, served by ponytail (it does the work of all five: links, compat,
    linker cache, masked /proc, application profile), in a mount namespace of its own as at createContainer."""
    hook = tmp_path / "bin/nvidia-cdi-hook"
    installed = subprocess.run([console_script("ponytail"), "install-nvidia-hook", "--at", str(hook)], capture_output=True, text=True, timeout=60)
    assert installed.returncode == 0, installed.stderr
    rootfs = make_rootfs(tmp_path / "bundle" / "rootfs")
    bundle = bundle_for(tmp_path, rootfs)
    lib = "/usr/lib/x86_64-linux-gnu"
    hooks = [["create-symlinks", "--link", f"libcuda.so.550.54.15::{lib}/libcuda.so.1"], ["enable-cuda-compat", "--host-driver-version=550.54.15"],
             ["update-ldcache", "--folder", lib], ["disable-device-node-modification"], ["update-application-profile"]]
    config = json.loads((bundle / "config.json").read_text())
    config["hooks"] = {"createContainer": [{"path": str(hook), "args": ["nvidia-cdi-hook", *args]} for args in hooks]}
    config["linux"]["devices"] = [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}]
    (bundle / "config.json").write_text(json.dumps(config))
    result = run_ponytail(["nvidia-hook", str(hook), *hooks[0]], stdin=state_for(bundle, 0),
                          env={"PYTHONPROFILEIMPORTTIME": "1", "PONYTAIL_CONFIG": str(host.write_config())}, command=[console_script("ponytail")])
    err = result.stderr.decode()
    assert result.returncode == 0, err[-3000:]
    assert (rootfs / lib.lstrip("/") / "libcuda.so.1").is_symlink() and (rootfs / "etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf").exists()
    modules = imported(err)
    assert "ponytail" in modules and not modules & WARM, sorted(modules & WARM)
    # the mark the later hooks of this start (the same parent: here this test) find in the shell
    assert [p.name for p in bundle.glob(".ponytail-nvidia-hooks-done.*")] == [f".ponytail-nvidia-hooks-done.{os.getpid()}"]
    later = subprocess.run(["/bin/sh", "-x", str(hook), *hooks[2]], input=state_for(bundle, 0), capture_output=True, text=True, timeout=30)
    assert later.returncode == 0 and "+ exit 0" in later.stderr and "exec" not in later.stderr, later.stderr  # the shell alone
