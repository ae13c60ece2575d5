"""The binary of ``make binary`` runs where there is no Python at all.

(The end-to-end injection tests in test_inject_e2e.py run with the binary too.)
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from support.fakehost import LIB_DIR, FakeHost, gpus, make_rootfs


def test_binary_needs_no_python_on_the_machine(binary: Path, tmp_path: Path) -> None:
    # a busybox image with the loader, libc and zlib (the binary's only system libraries),
    # the binary's folder, and a fake host: no Python, no pip packages
    rootfs = make_rootfs(tmp_path / "rootfs", programs=())
    shutil.copy(Path(f"{LIB_DIR}/libz.so.1").resolve(), rootfs / LIB_DIR.lstrip("/") / "libz.so.1")
    shutil.copytree(binary.parent, rootfs / "opt/ponytail", symlinks=True)
    host = FakeHost(rootfs / "host", gpu_list=gpus(2, minors=[1, 0]))
    (rootfs / "host/config.toml").write_text(host.config_text().replace(str(rootfs), ""))
    assert not [p for p in rootfs.rglob("python*") if p.is_file() and not p.is_relative_to(rootfs / "opt")]

    def run(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
        command = [shutil.which("chroot") or "chroot", str(rootfs), "/opt/ponytail/ponytail", *args]
        return subprocess.run(command, input=stdin, capture_output=True, env={"PATH": "/bin"}, timeout=60)

    info = run("info", "--json", "-config", "/host/config.toml")
    assert info.returncode == 0, info.stderr
    data = json.loads(info.stdout)
    assert data["driver_version"] == "550.54.15"
    assert [(g["index"], g["minor"]) for g in data["gpus"]] == [(0, 1), (1, 0)]

    plan = run("-debug", "-config", "/host/config.toml")
    # the dry run exits as the real run would: this chroot has no ldconfig to refresh a linker cache with
    assert plan.returncode == 1 and "set [host] ldconfig" in plan.stdout.decode(), plan.stdout + plan.stderr
    assert f"mount /host/driver{LIB_DIR}/libcuda.so.550.54.15 -> {LIB_DIR}/libcuda.so.550.54.15" in plan.stdout.decode()
    assert "skip" in plan.stdout.decode() and "535.104.05" in plan.stdout.decode()

    bad = run("-config", "/host/config.toml", stdin=b'{"id": "x"')
    assert bad.returncode == 2
    assert bad.stderr.decode().startswith("ponytail: error: OCI state on stdin is not valid JSON")
    assert "Traceback" not in bad.stderr.decode() and len(bad.stderr.decode().splitlines()) == 1

    usage = run("info", "--help")
    assert usage.returncode == 0 and b"PCI bus order" in usage.stdout


def test_binary_linked_as_ponytail_runtime_is_the_docker_shim(binary: Path, tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "host", gpu_list=gpus(2, minors=[1, 0]))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "ponytail").symlink_to(binary)
    (bindir / "ponytail-runtime").symlink_to(binary)
    runtime = tmp_path / "fake-runc"
    runtime.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/runtime-args\n")
    runtime.chmod(0o755)
    config = tmp_path / "config.toml"
    config.write_text(host.config_text() + f'[runtime]\npath = "{runtime}"\n')
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    spec = {"root": {"path": "rootfs"}, "process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"]}, "linux": {}}
    (bundle / "config.json").write_text(json.dumps(spec))
    result = subprocess.run(
        [str(bindir / "ponytail-runtime"), "--root", str(tmp_path / "state"), "create", "--bundle", str(bundle), "ctr1"],
        capture_output=True, env={"PATH": "/usr/bin:/bin", "PONYTAIL_CONFIG": str(config)}, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "runtime-args").read_text().split() == ["--root", str(tmp_path / "state"), "create", "--bundle", str(bundle), "ctr1"]
    edited = json.loads((bundle / "config.json").read_text())
    assert edited["hooks"]["prestart"][0]["path"] == str(bindir / "ponytail")
    rules = edited["linux"]["resources"]["devices"]
    assert {"allow": True, "type": "c", "major": 195, "minor": 1, "access": "rwm"} in rules  # GPU 0 has minor 1


def test_binary_carries_no_build_tools(binary: Path) -> None:
    # setuptools (found through ponytail.config's Python 3.10 fallback) brought its run-time hook, which
    # imported setuptools on every start of the binary; asyncio and multiprocessing came with it
    internal = binary.parent / "_internal"
    assert (internal / "ponytail").is_dir()
    carried = {p.name for p in internal.iterdir()}
    assert not carried & {"setuptools", "_distutils_hack", "pkg_resources", "distutils", "asyncio", "multiprocessing"}, sorted(carried)
