"""NVIDIA's `chmod --mode M --path P` hook, served by ponytail, sets the mode of the container's own files
only: never the root of a filesystem mounted at P (a private devpts at /dev/pts, a writable /sys, a volume or
a host directory bound there), whose mode is the kernel's or the host's. Run as the engine runs it, at
createContainer in a private mount namespace with the mounts already made."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from support.engines import console_script
from support.fakehost import FakeHost, gpus, make_rootfs

HOST_SHAPE = {"gpu_list": gpus(1)}


def chmod_in_namespace(host: FakeHost, tmp_path: Path, target: str, mount: str) -> tuple[str, str]:
    """``nvidia-cdi-hook chmod --mode 777 --path TARGET`` with ``mount`` (a shell command, run in the
    namespace first, $R the rootfs) made: (the output with the hook's status and the target's mode after, the log)."""
    bundle = tmp_path / "bundle"
    rootfs = make_rootfs(bundle / "rootfs")
    (rootfs / target.lstrip("/")).mkdir(parents=True, exist_ok=True)
    (rootfs / target.lstrip("/")).chmod(0o755)
    config = {"ociVersion": "1.0.2", "root": {"path": "rootfs"}, "process": {"args": ["sh"], "env": ["PATH=/bin"]}}
    (bundle / "config.json").write_text(json.dumps(config))
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"ociVersion": "1.0.2", "id": "chmod-test", "status": "creating", "pid": 0, "bundle": str(bundle)}))
    hook = tmp_path / "bin/nvidia-cdi-hook"
    hook.parent.mkdir()
    hook.symlink_to(console_script("ponytail"))
    # sysfs's root is one for every mount of it: a chmod there reaches the host's /sys, so it is put back whatever happened
    script = (f'R={rootfs}; {mount} && before=$(stat -c %a "$R{target}") && "$@" < {state}; echo "rc=$?"; '
              f'stat -c "mode=%a" "$R{target}"; chmod "$before" "$R{target}"')
    env = {"PATH": os.environ["PATH"], "PONYTAIL_CONFIG": str(host.write_config())}
    result = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", script, "--",
                             str(hook), "chmod", "--mode", "777", "--path", target], capture_output=True, text=True, timeout=120, env=env)
    return result.stdout + result.stderr, host.log.read_text() if host.log.exists() else ""


@pytest.mark.parametrize(("target", "mount", "kind"), [
    ("/dev/pts", 'mount -t devpts -o newinstance,mode=600,ptmxmode=666 devpts "$R/dev/pts"', "devpts"),
    ("/sys", 'mount -t sysfs sysfs "$R/sys"', "sysfs"),
])
def test_a_kernel_filesystem_mounted_at_the_path_keeps_its_mode(host: FakeHost, tmp_path: Path, target: str, mount: str, kind: str) -> None:
    out, log = chmod_in_namespace(host, tmp_path, target, mount)
    assert "rc=1" in out and "mode=777" not in out, out
    refusal = f"refusing to chmod 777 at {target}: it is the root of a mount of the kernel's {kind} filesystem"
    assert out.count(refusal) == 1, out
    assert [line for line in log.splitlines() if "error" in line and refusal in line], log


def test_another_filesystem_mounted_at_the_path_is_left_with_a_warning(host: FakeHost, tmp_path: Path) -> None:
    """A volume (here a tmpfs) or a directory of the host's bound at the path: its mode is not the container's to set."""
    out, log = chmod_in_namespace(host, tmp_path, "/dev/dri", 'mount -t tmpfs -o mode=755 tmpfs "$R/dev/dri"')
    assert "rc=0" in out and "mode=755" in out, out
    warned = [line for line in log.splitlines() if "mode of /dev/dri left as it is (not 777): it is a mount point" in line]
    assert len(warned) == 1 and "warning" in warned[0], log
    bound = tmp_path / "hosts-dir"
    bound.mkdir(mode=0o755)
    out, _ = chmod_in_namespace(host, tmp_path / "again", "/dev/dri", f'mount --bind {bound} "$R/dev/dri"')
    assert "rc=0" in out and "mode=755" in out and oct(bound.stat().st_mode)[-3:] == "755", out


def test_the_containers_own_directory_gets_its_mode(host: FakeHost, tmp_path: Path) -> None:
    out, log = chmod_in_namespace(host, tmp_path, "/dev/dri", "true")
    assert "rc=0" in out and "mode=777" in out, out
