"""Rootless podman (podman 4.3, runc, an ordinary user: nobody, with podman's single-uid mapping) with
ponytail's CDI spec: a GPU container starts when the spec's hook is a ponytail every user can run (the
binary, world-readable) and the nodes are at their container paths in /dev (rootless runc bind-mounts
each node from that path). When the hook is not runnable by the user (a venv whose interpreter lies under
/root), the start fails with the runtime's "permission denied" and `ponytail check` says why beforehand.

Each run is in a mount namespace of its own: a tmpfs /dev with the host's ordinary nodes bound in and
the fake host's NVIDIA nodes bound at /dev/nvidia*, a tmpfs /run holding the spec in /run/cdi; podman's
storage and runtime directories are the test's. Nothing of the machine's /dev, /run or /etc changes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.engines import console_script
from support.fakehost import FakeHost, gpus, make_rootfs
from support.harness import run_ponytail
from support.hostile import CUDA_OK

NOBODY = 65534
NODES = ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
CHECK = "/usr/local/bin/cudacheck /dev/nvidia0 /dev/nvidia1 /dev/nvidiactl"


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory every user can read (pytest's own are root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="ponytail-rootless-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _open_to_all(base: Path, host: FakeHost) -> None:
    for path in [base, *base.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            path.chmod(path.stat().st_mode | 0o755)
    host.log.touch()
    host.log.chmod(0o666)  # the hook runs as the user
    for node in NODES:
        if (host.dev / node).exists():
            (host.dev / node).chmod(0o666)  # as the driver makes them (NVreg_DeviceFileMode)


def _installed_for_all(binary: Path, base: Path) -> Path:
    """The binary (its folder: the program and _internal/) where every user can run it."""
    shutil.copytree(binary.parent, base / "bin", symlinks=True)
    return base / "bin" / binary.name


def _spec(host: FakeHost, base: Path, hook: str) -> Path:
    spec = base / "spec/nvidia.yaml"
    spec.parent.mkdir(exist_ok=True)
    made = run_ponytail(["cdi", "generate", "-config", str(host.write_config()), "--hook-path", hook, "--output", str(spec)])
    assert made.returncode == 0, made.stderr
    spec.chmod(0o644)
    return spec


def rootless_run(base: Path, host: FakeHost, spec: Path, runtime: str = "runc") -> subprocess.CompletedProcess:
    rootfs = make_rootfs(base / f"rootfs-{runtime}-{len(list(base.iterdir()))}")
    home = base / f"h{len(list(base.iterdir()))}"  # podman wants a runroot of at most 50 characters
    (home / "run").mkdir(parents=True)
    for path in (rootfs, home):
        subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(path)], check=True)
    (home / "run").chmod(0o700)
    _open_to_all(base, host)
    real = base / "realdev"
    real.mkdir(exist_ok=True)
    binds = " && ".join(f"touch /dev/{n} && mount --bind {host.dev}/{n} /dev/{n}" for n in NODES if (host.dev / n).exists())
    podman = (f"podman --runtime {runtime} --root {home}/storage --runroot {home}/rr --cgroup-manager cgroupfs "
              f"--events-backend file --storage-driver vfs run --rm --network=none --device nvidia.com/gpu=0 --rootfs {rootfs} sh -c '{CHECK}'")
    script = (
        f"mount --bind /dev {real} && mount -t tmpfs -o mode=755 tmpfs /dev && "
        f"for n in null zero full random urandom tty ptmx; do touch /dev/$n && mount --bind {real}/$n /dev/$n; done && "
        f"mkdir /dev/pts /dev/shm && mount --bind {real}/pts /dev/pts && mount -t tmpfs -o mode=1777 tmpfs /dev/shm && {binds} && "
        f"mount -t tmpfs tmpfs /run && mkdir /run/cdi && cp {spec} /run/cdi/ && "
        f"exec setpriv --reuid {NOBODY} --regid {NOBODY} --clear-groups env -i PATH=/usr/bin:/usr/sbin:/bin HOME={home} "
        f"XDG_RUNTIME_DIR={home}/run {podman}"
    )
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], capture_output=True, text=True, timeout=180)


def test_a_gpu_container_of_an_ordinary_user(base: Path, binary: Path) -> None:
    host = FakeHost(base / "host", gpu_list=gpus(2))
    hook = _installed_for_all(binary, base)
    spec = _spec(host, base, str(hook))
    result = rootless_run(base, host, spec)
    assert result.returncode == 0, result.stderr
    assert CUDA_OK in result.stdout, result.stdout
    assert "open /dev/nvidia0 ENXIO" in result.stdout and "open /dev/nvidia1 ENOENT" in result.stdout, result.stdout
    assert "cdi-hook in" in host.log.read_text()


def test_a_hook_the_user_cannot_run_is_said_before_and_fails_the_start(base: Path) -> None:
    command = console_script("ponytail")
    interpreter = os.path.realpath(Path(command).read_text().splitlines()[0][2:].strip())
    if all(os.stat(p).st_mode & 0o001 for p in [interpreter, *Path(interpreter).parents]):
        pytest.skip(f"this install's ponytail ({command}, interpreter {interpreter}) is runnable by every user")
    host = FakeHost(base / "host", gpu_list=gpus(2))
    spec = _spec(host, base, command)
    root = base / "engine-root"
    (root / "var/run/cdi").mkdir(parents=True)
    shutil.copy(spec, root / "var/run/cdi/nvidia.yaml")
    report = json.loads(run_ponytail(["check", "-config", str(host.write_config()), "--engine-root", str(root), "--json"]).stdout)
    cdi = [f for f in report["findings"] if f["subject"] == "CDI"]
    assert len(cdi) == 1 and "rootless podman" in cdi[0]["message"] and "cannot run" in cdi[0]["message"], cdi
    result = rootless_run(base, host, spec)
    assert result.returncode != 0 and "permission denied" in result.stderr, result.stderr


def test_crun_refuses_this_cgroup_layout(base: Path, binary: Path) -> None:
    if not shutil.which("crun"):
        pytest.skip("crun is not installed")
    host = FakeHost(base / "host", gpu_list=gpus(2))
    hook = _installed_for_all(binary, base)
    result = rootless_run(base, host, _spec(host, base, str(hook)), runtime="crun")
    assert result.returncode != 0 and CUDA_OK not in result.stdout, result.stdout


def test_check_says_podman_runs_crun_on_this_hybrid_layout(base: Path) -> None:
    if not shutil.which("crun"):
        pytest.skip("crun is not installed: podman's default is runc then")
    host = FakeHost(base / "host", gpu_list=gpus(1))
    (host.sys / "fs/cgroup/devices").mkdir(parents=True)
    (host.sys / "fs/cgroup/unified").mkdir()
    (host.sys / "fs/cgroup/unified/cgroup.controllers").write_text("\n")
    root = base / "engine-root"
    (root / "etc/containers").mkdir(parents=True)

    def finding() -> dict:
        report = json.loads(run_ponytail(["check", "-config", str(host.write_config()), "--engine-root", str(root), "--engine", "podman",
                                          "--json"]).stdout)
        found = [f for f in report["findings"] if f["subject"] == "podman runtime"]
        assert len(found) == 1, report["findings"]
        return found[0]

    crun = finding()
    assert crun["level"] == "warning" and "podman runs crun (podman's default)" in crun["message"] and 'runtime = "runc"' in crun["message"]
    (root / "etc/containers/containers.conf").write_text('[engine]\nruntime = "runc"\n')
    runc = finding()
    assert runc["level"] == "ok" and "runtime in /etc/containers/containers.conf" in runc["message"], runc
