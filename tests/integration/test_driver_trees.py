"""Per-container user-mode drivers: [drivers.NAME] trees selected with PONYTAIL_DRIVER or the
com.example.gpu.driver annotation. Each tree's own gcc-built libcuda reports its own CUDA
version, so a container proves which build it loaded."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from support.engines import hook_entry, oci_bundle, unique
from support.fakehost import FakeHost, compile_library, gpus
from support.harness import bundle_for, run_ponytail, state_for

BUILD_A = ("560.28.03", 12060)
BUILD_B = ("570.86.10", 12080)
SAME = ("550.54.15", 12041)  # the kernel module's version, another build of it


@pytest.fixture
def trees(tmp_path: Path) -> tuple[FakeHost, Path]:
    host = FakeHost(tmp_path / "host", gpu_list=gpus(2))
    roots = {name: host.add_driver_tree(name, *build) for name, build in (("build-a", BUILD_A), ("build-b", BUILD_B), ("same", SAME))}
    config = host.write_config()
    text = config.read_text()
    for name in ("build-a", "build-b"):
        text += f'[drivers.{name}]\nroot = "{roots[name]}"\ndescription = "nightly {name}"\nkernel_modules = ["550.54.15"]\n'
    text += f'[drivers.same]\nroot = "{roots["same"]}"\n'
    text += f'[drivers.strict]\nroot = "{roots["build-a"]}"\n'  # 560 on a 550 module, not allowed
    config.write_text(text)
    return host, config


def _debug_in_hook_mode(tmp_path: Path, config: Path, env: list[str], annotations: dict | None = None) -> subprocess.CompletedProcess:
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir(exist_ok=True)
    bundle = bundle_for(tmp_path, rootfs, env=["PATH=/bin", *env])
    state = json.loads(state_for(bundle, 1))
    if annotations:
        state["annotations"] = annotations
    return run_ponytail(["-config", str(config), "-debug"], stdin=json.dumps(state))


def test_list_takes_libraries_and_binaries_from_the_named_tree(trees: tuple[FakeHost, Path]) -> None:
    host, config = trees
    result = run_ponytail(["list", "-config", str(config), "--driver", "build-a"])
    assert result.returncode == 0, result.stderr
    paths = result.stdout.decode().splitlines()
    tree = host.base / "umd/build-a"
    assert f"{tree}/usr/lib/x86_64-linux-gnu/libcuda.so.560.28.03" in paths
    assert f"{tree}/usr/bin/nvidia-smi" in paths
    assert f"{host.dev}/nvidia0" in paths  # device nodes stay the host's
    assert not any(str(host.driver) in p for p in paths)
    assert "driver tree 'build-a'" in result.stderr.decode() and "--driver=build-a" in result.stderr.decode()


def test_debug_says_which_tree_and_why(trees: tuple[FakeHost, Path], tmp_path: Path) -> None:
    _, config = trees
    result = _debug_in_hook_mode(tmp_path, config, ["PONYTAIL_DRIVER=same"])
    out = result.stdout.decode()
    assert result.returncode == 0, result.stderr
    assert "user-mode driver: driver tree 'same'" in out and "version 550.54.15 (PONYTAIL_DRIVER=same)" in out
    assert "umd/same/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15" in out


def test_the_annotation_selects_a_tree_too(trees: tuple[FakeHost, Path], tmp_path: Path) -> None:
    _, config = trees
    result = _debug_in_hook_mode(tmp_path, config, [], {"com.example.gpu.driver": "build-b"})
    out = result.stdout.decode()
    assert "driver tree 'build-b'" in out and "annotation com.example.gpu.driver=build-b" in out
    assert "libcuda.so.570.86.10" in out


def test_info_lists_the_trees_and_whether_each_can_serve(trees: tuple[FakeHost, Path]) -> None:
    _, config = trees
    result = run_ponytail(["info", "--json", "-config", str(config)])
    assert result.returncode == 0, result.stderr
    rows = {t["name"]: t for t in json.loads(result.stdout)["driver_trees"]}
    assert rows["build-a"]["version"] == "560.28.03" and rows["build-a"]["usable"]
    assert rows["same"]["usable"]
    assert not rows["strict"]["usable"] and "550.54.15" in rows["strict"]["problem"]
    text = run_ponytail(["info", "-config", str(config)]).stdout.decode()
    assert "PONYTAIL_DRIVER=NAME" in text and "nightly build-b" in text


def test_a_tree_of_another_version_is_refused_in_one_line(trees: tuple[FakeHost, Path]) -> None:
    _, config = trees
    result = run_ponytail(["list", "-config", str(config), "--driver", "strict"])
    err = result.stderr.decode()
    assert result.returncode == 1
    assert err.count("\n") == 1 and "560.28.03" in err and "550.54.15" in err and "kernel_modules" in err


@pytest.mark.parametrize("name", ["nosuch", "/opt/umd/build-a", "../umd/build-a", "build-a/../same"])
def test_hostile_driver_names_are_refused(trees: tuple[FakeHost, Path], tmp_path: Path, name: str) -> None:
    host, config = trees
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    bundle = bundle_for(tmp_path, rootfs, env=["PATH=/bin", f"PONYTAIL_DRIVER={name}"])
    result = run_ponytail(["-config", str(config)], stdin=state_for(bundle, 1))
    err = result.stderr.decode()
    assert result.returncode == 2, err
    assert err.count("\n") == 1 and "registered" in err
    assert list(rootfs.iterdir()) == []  # nothing injected


@pytest.mark.parametrize(
    "table, complaint",
    [
        ('[drivers.x]\ndescription = "no root"\n', "'drivers.x.root' is missing"),
        ('[drivers.x]\nroot = "relative"\n', "absolute path"),
        ('[drivers.x]\nroot = "/opt"\nkernel_modules = "550"\n', "'drivers.x.kernel_modules' must be a list"),
        ('[drivers.x]\nroot = "/opt"\ncolour = "red"\n', "unknown key 'drivers.x.colour'"),
        ('[drivers."a b"]\nroot = "/opt"\n', "a driver name is letters"),
        ("[cuda]\ncompat = 1\n", "'cuda.compat' must be true or false"),
    ],
)
def test_bad_driver_tables_name_the_file_and_key(tmp_path: Path, table: str, complaint: str) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(table)
    result = run_ponytail(["list", "-config", str(config)])
    err = result.stderr.decode()
    assert result.returncode == 2 and str(config) in err and complaint in err, err


def test_two_containers_at_once_each_load_their_own_build(trees: tuple[FakeHost, Path], tmp_path: Path) -> None:
    """runc creates both containers (the hook injects at create), so both live at once, each
    with its own build mounted; then both run, and each one's libcuda reports its tree's CUDA."""
    _, config = trees
    hooks = {"prestart": [hook_entry(config)]}
    containers = {}
    try:
        for name in ("build-a", "build-b"):
            bundle = oci_bundle(tmp_path, ["/usr/local/bin/cudacheck", "/dev/nvidia0"], env=["NVIDIA_VISIBLE_DEVICES=0", f"PONYTAIL_DRIVER={name}"], hooks=hooks)
            container_id = unique()
            containers[name] = (container_id, tmp_path / f"{name}.out")
            errors = tmp_path / f"{name}.err"
            with open(containers[name][1], "w") as out, open(errors, "w") as err:  # the container keeps both open
                created = subprocess.run(
                    ["runc", "create", "--bundle", str(bundle), container_id], stdout=out, stderr=err, stdin=subprocess.DEVNULL, timeout=120,
                )
            assert created.returncode == 0, errors.read_text()
        libraries = {}
        for name, (container_id, _) in containers.items():
            state = json.loads(subprocess.run(["runc", "state", container_id], capture_output=True, text=True, check=True).stdout)
            assert state["status"] == "created"
            libraries[name] = sorted(os.listdir(f"/proc/{state['pid']}/root/usr/lib/x86_64-linux-gnu"))
        assert "libcuda.so.560.28.03" in libraries["build-a"] and "libcuda.so.570.86.10" not in libraries["build-a"]
        assert "libcuda.so.570.86.10" in libraries["build-b"] and "libcuda.so.560.28.03" not in libraries["build-b"]
        for container_id, _ in containers.values():
            subprocess.run(["runc", "start", container_id], check=True, capture_output=True, timeout=120)
        for container_id, _ in containers.values():
            _wait_stopped(container_id)
        outputs = {name: out.read_text().splitlines() for name, (_, out) in containers.items()}
    finally:
        for container_id, _ in containers.values():
            subprocess.run(["runc", "delete", "-f", container_id], capture_output=True, timeout=120)
    assert outputs["build-a"] == ["cuDriverGetVersion 12060", "open /dev/nvidia0 ENXIO"]
    assert outputs["build-b"] == ["cuDriverGetVersion 12080", "open /dev/nvidia0 ENXIO"]


def _wait_stopped(container_id: str) -> None:
    for _ in range(1200):
        state = subprocess.run(["runc", "state", container_id], capture_output=True, text=True)
        if state.returncode != 0 or json.loads(state.stdout)["status"] == "stopped":
            return
        time.sleep(0.1)
    raise AssertionError(f"container {container_id} did not stop")


def test_firmware_comes_from_the_tree(trees: tuple[FakeHost, Path]) -> None:
    host, config = trees
    for root, version in ((host.base / "umd/build-a", BUILD_A[0]), (host.driver, "550.54.15")):
        firmware = root / "lib/firmware/nvidia" / version
        firmware.mkdir(parents=True)
        (firmware / "gsp_ga10x.bin").write_bytes(b"GSP" + version.encode())
    paths = run_ponytail(["list", "-config", str(config), "--driver", "build-a"]).stdout.decode().splitlines()
    assert f"{host.base}/umd/build-a/lib/firmware/nvidia/560.28.03/gsp_ga10x.bin" in paths
    assert not any("firmware/nvidia/550" in p for p in paths)


def test_the_cuda_requirement_is_checked_against_the_tree(trees: tuple[FakeHost, Path], tmp_path: Path) -> None:
    _, config = trees
    require = "NVIDIA_REQUIRE_CUDA=cuda>=12.6"
    host_driver = _debug_in_hook_mode(tmp_path, config, [require]).stdout.decode()
    assert "problem: this host does not meet NVIDIA_REQUIRE_CUDA='cuda>=12.6'" in host_driver and "CUDA 12.4" in host_driver
    tree = _debug_in_hook_mode(tmp_path, config, [require, "PONYTAIL_DRIVER=build-a"]).stdout.decode()
    assert "problem:" not in tree and "driver tree 'build-a'" in tree


def _half_updated(tree: Path) -> None:
    """libcuda of 560 beside libnvidia-ml of 550: an update stopped half-way."""
    libdir = tree / "usr/lib/x86_64-linux-gnu"
    shutil.copy(compile_library("fake_libnvidia_ml.c", "libnvidia-ml.so.1", "libnvidia-ml.so.550.54.15", "550.54.15"), libdir / "libnvidia-ml.so.550.54.15")
    (libdir / "libnvidia-ml.so.1").unlink()
    (libdir / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.550.54.15")
    (libdir / "libnvidia-ml.so.560.28.03").unlink()


def _dangling_libcuda(tree: Path) -> None:
    (tree / "usr/lib/x86_64-linux-gnu/libcuda.so.560.28.03").unlink()


def _no_libcuda(tree: Path) -> None:
    """No libcuda.so.1 at all, only libnvidia-ml: every start asking for compute (the default) fails."""
    libdir = tree / "usr/lib/x86_64-linux-gnu"
    (libdir / "libcuda.so.1").unlink()
    (libdir / "libcuda.so.560.28.03").unlink()
    subprocess.run(["ldconfig", "-r", str(tree)], check=True)


@pytest.mark.parametrize("breakage, says", [
    (_half_updated, "half-updated: libcuda.so.1 is 560.28.03 but libnvidia-ml.so.1 is 550.54.15"),
    (_no_libcuda, "no libcuda.so.1 named by version (libcuda.so.560.28.03): the default capabilities need it"),
    (_dangling_libcuda, "its /usr/lib/x86_64-linux-gnu/libcuda.so.1 (libcuda.so.1) leads to no file in the tree"),
])
def test_a_half_updated_or_broken_tree_is_not_usable_anywhere_and_a_start_names_the_tree(
    trees: tuple[FakeHost, Path], tmp_path: Path, breakage, says: str
) -> None:
    host, config = trees
    tree = host.base / "umd/build-a"
    breakage(tree)
    rows = {t["name"]: t for t in json.loads(run_ponytail(["info", "--json", "-config", str(config)]).stdout)["driver_trees"]}
    assert not rows["build-a"]["usable"] and says in rows["build-a"]["problem"], rows["build-a"]
    assert "build-a" in run_ponytail(["info", "-config", str(config)]).stdout.decode()
    check = run_ponytail(["check", "-config", str(config)]).stdout.decode()
    [line] = [line for line in check.splitlines() if "driver tree build-a" in line]
    assert says in line and "ok" not in line.split()[0].lower(), line
    bundle = oci_bundle(tmp_path, ["true"], env=["PONYTAIL_DRIVER=build-a"], hooks={"prestart": [hook_entry(config)]})
    name = unique()
    result = subprocess.run(["runc", "run", "--bundle", str(bundle), name], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    subprocess.run(["runc", "delete", "-f", name], capture_output=True, timeout=120)
    assert result.returncode != 0 and f"driver tree 'build-a' at {tree}" in result.stderr and says in result.stderr, result.stderr
    assert f"driver root {host.driver}" not in result.stderr
