"""The command as a user meets it: exit codes, one-line errors, -debug, info, the log file."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from support.commands import PONYTAIL, shell
from support.fakehost import FakeGpu, FakeHost
from support.harness import bundle_for, run_ponytail, state_for, tree_digest


def one_line_error(result) -> str:
    err = result.stderr.decode()
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def test_info_json_lists_gpus_in_pci_order_with_their_own_minors(host: FakeHost) -> None:
    result = run_ponytail(["info", "--json", "-config", str(host.write_config())])
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["driver_version"] == "550.54.15"
    assert [(g["index"], g["minor"], g["pci_bus_id"]) for g in data["gpus"]] == [
        (0, 2, "0000:18:00.0"),
        (1, 0, "0000:28:00.0"),
        (2, 1, "0000:38:00.0"),
    ]
    assert {"index", "minor", "pci_bus_id", "uuid", "model"} <= set(data["gpus"][0])
    assert data["cuda_version"] == "12.4"


def test_info_ignores_non_gpu_functions_and_reads_32bit_domains(tmp_path: Path) -> None:
    gpu = FakeGpu("0000:c1:00.0", 5, "GPU-c1", "NVIDIA A100", proc_bus_id="00000000:c1:00.0")
    host = FakeHost(tmp_path / "h", gpu_list=[gpu], open_module=True, driver_version="580.95.05", stale_versions=())
    result = run_ponytail(["info", "-config", str(host.write_config())])
    assert result.returncode == 0, result.stderr
    out = result.stdout.decode()
    assert "driver version: 580.95.05" in out
    assert "gpus: 1" in out and "index 0  minor 5  0000:c1:00.0  GPU-c1  NVIDIA A100" in out


def test_debug_prints_the_plan_and_leaves_the_rootfs_untouched(host: FakeHost, rootfs: Path) -> None:
    before = tree_digest(rootfs)
    result = run_ponytail(["-config", str(host.write_config()), "-root", str(rootfs), "-device", "1", "-debug"])
    assert result.returncode == 0, result.stderr
    out = result.stdout.decode()
    assert tree_digest(rootfs) == before
    assert "dry run" in out
    assert "/dev/nvidia0  (c 195:0, GPU 1 0000:28:00.0" in out
    assert "/dev/nvidia2 ->" not in out
    assert "libcuda.so.550.54.15 -> /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15" in out
    assert "skip /usr/lib/x86_64-linux-gnu/libcuda.so.535.104.05: driver version 535.104.05" in out
    assert "link  /usr/lib/x86_64-linux-gnu/libcuda.so.1 -> libcuda.so.550.54.15" in out
    assert "ldconfig -X -r <rootfs> /usr/lib/x86_64-linux-gnu" in out
    assert "dry run" in host.log.read_text()


def test_debug_without_state_and_with_state(host: FakeHost, tmp_path: Path, rootfs: Path) -> None:
    config = str(host.write_config())
    alone = run_ponytail(["-config", config, "-debug"], stdin=b"")
    assert alone.returncode == 0, alone.stderr
    assert "no container" in alone.stdout.decode()
    bundle = bundle_for(tmp_path, rootfs, env=["NVIDIA_VISIBLE_DEVICES=2"])
    before = tree_digest(rootfs)
    with_state = run_ponytail(["-config", config, "-debug"], stdin=state_for(bundle, os.getpid()))
    assert with_state.returncode == 0, with_state.stderr
    out = with_state.stdout.decode()
    assert f"hook mode: container test-ctr pid {os.getpid()}" in out
    assert "devices requested: '2' (from NVIDIA_VISIBLE_DEVICES)" in out
    assert "/dev/nvidia1  (c 195:1, GPU 2" in out
    assert tree_digest(rootfs) == before


@pytest.mark.parametrize(
    "selector, minors",
    [("all", [2, 0, 1]), ("2,0", [1, 2]), ("GPU-00000001-1111-2222-3333-000000000000", [0]), ("00000000:38:00.0", [1]), ("0000:18:00.0", [2]), ("none", [])],
)
def test_device_selectors(host: FakeHost, selector: str, minors: list[int]) -> None:
    result = run_ponytail(["-config", str(host.write_config()), "-device", selector, "-debug"])
    assert result.returncode == 0, result.stderr
    out = result.stdout.decode()
    mounted = sorted(int(line.split("/dev/nvidia")[2].split()[0]) for line in out.splitlines() if "mount" in line and " -> /dev/nvidia" in line and "ctl" not in line and "uvm" not in line)
    assert mounted == sorted(minors)


def test_unknown_gpu_is_exit_2_and_names_it(host: FakeHost, rootfs: Path) -> None:
    result = run_ponytail(["-config", str(host.write_config()), "-root", str(rootfs), "-device", "0,7"])
    assert result.returncode == 2
    line = one_line_error(result)
    assert "unknown GPU '7'" in line and "3 GPUs" in line
    assert "unknown GPU '7'" in host.log.read_text()


@pytest.mark.parametrize(
    "stdin, message",
    [
        (b"", "no OCI state on stdin"),
        (b'{"id": "x", "pid": 1, "bundle": "/b"', "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"id": "x", "pid": "12", "bundle": "/b"}', "'pid' must be a positive integer"),
        (b'{"id": "x", "pid": 12}', "'bundle' is missing"),
        (b'{"id": "x", "pid": 12, "bundle": "/nonexistent/bundle"}', "/nonexistent/bundle/config.json not found"),
        (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
    ],
    ids=["empty", "truncated", "array", "pid-string", "no-bundle", "missing-bundle", "deep"],
)
def test_bad_state_is_one_line_and_exit_2(host: FakeHost, stdin: bytes, message: str) -> None:
    result = run_ponytail(["-config", str(host.write_config())], stdin=stdin)
    assert result.returncode == 2, result.stderr
    assert message in one_line_error(result)


def test_gone_pid_is_a_clear_error(host: FakeHost, tmp_path: Path, rootfs: Path) -> None:
    bundle = bundle_for(tmp_path, rootfs)
    result = run_ponytail(["-config", str(host.write_config())], stdin=state_for(bundle, 4194000))
    assert result.returncode == 2
    assert "container process 4194000 is gone" in one_line_error(result)


def test_bad_config_is_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[host]\nsys_root = 5\n")
    result = run_ponytail(["-config", str(config), "-debug"])
    assert result.returncode == 2
    assert f"config file {config}: 'host.sys_root' must be a string" in one_line_error(result)


def test_env_var_names_the_config(host: FakeHost) -> None:
    result = run_ponytail(["info"], env={"PONYTAIL_CONFIG": str(host.write_config())})
    assert result.returncode == 0, result.stderr
    assert "gpus: 3" in result.stdout.decode()


def test_no_driver_is_exit_1_with_what_to_do(tmp_path: Path, rootfs: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(f'[host]\nproc_root = "{tmp_path}"\n[log]\nfile = "{tmp_path}/log"\n')
    result = run_ponytail(["-config", str(config), "-root", str(rootfs)])
    assert result.returncode == 1
    assert "no NVIDIA driver loaded" in one_line_error(result)


def test_missing_gpu_node_fails_before_changing_anything(host: FakeHost, rootfs: Path) -> None:
    (host.dev / "nvidia0").unlink()
    before = tree_digest(rootfs)
    result = run_ponytail(["-config", str(host.write_config()), "-root", str(rootfs), "-device", "1"])
    assert result.returncode == 1
    assert "nvidia0 does not exist" in one_line_error(result)
    assert tree_digest(rootfs) == before


def test_no_library_found_is_a_clear_error(host: FakeHost, rootfs: Path) -> None:
    result = run_ponytail(["-config", str(host.write_config()), "-root", str(rootfs), "-libs", "/opt/nowhere/libnvcuda.so.*"])
    assert result.returncode == 1
    assert "no library of driver 550.54.15 found (searched /opt/nowhere/libnvcuda.so.*" in one_line_error(result)


@pytest.mark.parametrize("args", [["-bogus"], ["-root"], ["info", "--nope"]])
def test_usage_errors_are_exit_2(args: list[str]) -> None:
    result = run_ponytail(args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr.decode()


def test_help_teaches_both_spellings_and_modes() -> None:
    result = run_ponytail(["--help"])
    assert result.returncode == 0
    out = result.stdout.decode()
    for text in ("-root, --root DIR", "-device, --device SEL", "-libs, --libs", "-debug, --debug", "Hook mode", "info"):
        assert text in out


def test_hook_mode_at_a_terminal_says_what_to_do_instead_of_waiting(host: FakeHost) -> None:
    # `script` gives ponytail a terminal on stdin, as when a person types the bare command
    result = subprocess.run(
        ["script", "-qec", f"{shell(PONYTAIL)} -config {host.write_config()}", "/dev/null"],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )
    assert "no OCI state on stdin" in result.stdout and "-root DIR" in result.stdout
    assert result.returncode == 2
