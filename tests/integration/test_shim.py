"""ponytail-runtime on its own: the runtime command lines it must read (runc's and
crun's global flags, every spelling of --bundle), a real runc driven through it the way
containerd drives it, pass-through of everything else, and its errors."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from ponytail.container.oci import Spec, read_spec
from ponytail.hooks.shim.argv import RuntimeCall, parse_runtime_args
from ponytail.hooks.shim.edit import add_gpu_hook, spec_asks_for_gpus

from support.engines import CUDACHECK_GPU0, EXPECTED_GPU0, console_script, oci_bundle, unique
from support.fakehost import FakeHost

CONTAINERD_CREATE = [
    "--root", "/var/run/docker/runtime-runc/moby", "--log", "/run/x/log.json", "--log-format", "json",
    "--systemd-cgroup", "create", "--bundle", "/run/x/b", "--pid-file", "/run/x/init.pid",
    "--console-socket", "/tmp/pty.sock", "abc123",
]


@pytest.mark.parametrize(
    "args, expected",
    [
        (CONTAINERD_CREATE, RuntimeCall("create", "/run/x/log.json", "json", "/run/x/b", "abc123")),
        (["--root=/r", "--debug", "create", "-b", "rel", "id1"], RuntimeCall("create", None, "text", "/cwd/rel", "id1")),
        (["create", "--bundle=/b", "--no-pivot", "id2"], RuntimeCall("create", None, "text", "/b", "id2")),
        (["-log", "/l", "create", "-b=/b", "--", "id3"], RuntimeCall("create", "/l", "text", "/b", "id3")),
        (["create", "id4"], RuntimeCall("create", None, "text", "/cwd", "id4")),
        (["--criu", "create", "run", "--bundle", "/b", "id5"], RuntimeCall("run", None, "text", "/b", "id5")),
        (["--root", "/r", "--log", "/l", "start", "abc"], RuntimeCall("start", "/l")),
        (["state", "--bundle", "/b", "x"], RuntimeCall("state")),
        (["--version"], RuntimeCall(None)),
        ([], RuntimeCall(None)),
        (["--root"], RuntimeCall(None)),
    ],
)
def test_runtime_command_lines(args: list[str], expected: RuntimeCall) -> None:
    assert parse_runtime_args(args, "/cwd") == expected


def test_what_asks_for_gpus() -> None:
    def spec(env: list[str], annotations: dict | None = None) -> Spec:
        return read_spec({"process": {"env": ["PATH=/bin", *env]}, "annotations": annotations or {}}, "config.json")

    assert spec_asks_for_gpus(spec(["NVIDIA_VISIBLE_DEVICES=0"]))
    assert spec_asks_for_gpus(spec(["NVIDIA_VISIBLE_DEVICES=none"]))  # driver files, no GPU: still the hook's job
    assert spec_asks_for_gpus(spec([], {"com.example.gpu": "true"}))
    assert not spec_asks_for_gpus(spec([]))
    assert not spec_asks_for_gpus(spec(["NVIDIA_VISIBLE_DEVICES=void"]))
    assert not spec_asks_for_gpus(spec(["NVIDIA_VISIBLE_DEVICES= "]))
    assert not spec_asks_for_gpus(spec([], {"com.example.gpu": "yes"}))
    assert not spec_asks_for_gpus(read_spec({}, "config.json"))


def test_add_gpu_hook_is_idempotent_and_keeps_the_input() -> None:
    spec = {"hooks": {"prestart": [{"path": "/usr/bin/other"}]}, "linux": {"resources": {"devices": [{"allow": False, "access": "rwm"}]}}}
    hook = {"path": "/opt/bin/ponytail", "args": ["ponytail"]}
    once = add_gpu_hook(spec, hook, ((195, 0),))
    twice = add_gpu_hook(once, hook, ())
    assert spec["hooks"]["prestart"] == [{"path": "/usr/bin/other"}]
    assert twice["hooks"]["prestart"] == [{"path": "/usr/bin/other"}, hook]
    assert twice["linux"]["resources"]["devices"] == [
        {"allow": False, "access": "rwm"},
        {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rwm"},
    ]
    assert add_gpu_hook({}, hook, ((511, 1),))["linux"]["resources"]["devices"][0]["minor"] == 1


def shim(args: list[str], config: Path, cwd: Path | None = None, output: Path | None = None) -> subprocess.CompletedProcess:
    """Run ponytail-runtime; with ``output``, its stdout and stderr (and the container's) go to that file."""
    env = {"PATH": os.environ["PATH"], "PONYTAIL_CONFIG": str(config)}
    command = [console_script("ponytail-runtime"), *args]
    if output is None:
        return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    with open(output, "w") as out:  # `create` leaves the container holding its stdio: no pipes
        return subprocess.run(command, env=env, cwd=cwd, stdout=out, stderr=out, timeout=60, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("spelling", ["--bundle", "-b", "--bundle=", "cwd"])
def test_runc_through_the_shim_as_containerd_calls_it(spelling: str, host: FakeHost, tmp_path: Path) -> None:
    config = host.write_config()
    bundle = oci_bundle(tmp_path, CUDACHECK_GPU0, env=["NVIDIA_VISIBLE_DEVICES=0"])
    container_id = unique()
    state, log, output = tmp_path / "runc-state", tmp_path / "log.json", tmp_path / "out"
    globals_ = ["--root", str(state), "--log", str(log), "--log-format", "json"]
    where = {"--bundle": ["--bundle", str(bundle)], "-b": ["-b", str(bundle)], "--bundle=": [f"--bundle={bundle}"], "cwd": []}[spelling]
    created = shim([*globals_, "create", *where, container_id], config, cwd=bundle, output=output)
    try:
        assert created.returncode == 0, output.read_text()
        assert shim([*globals_, "start", container_id], config).returncode == 0
        deadline = time.monotonic() + 120  # seconds on a busy machine
        while time.monotonic() < deadline:
            current = shim([*globals_, "state", container_id], config)
            if json.loads(current.stdout)["status"] == "stopped":
                break
            time.sleep(0.05)
    finally:
        shim([*globals_, "delete", "-f", container_id], config)
    assert output.read_text().splitlines() == EXPECTED_GPU0
    assert f"container={container_id} ponytail-runtime: GPU container: added the prestart hook" in host.log.read_text()


@pytest.mark.parametrize("swarm", ["", '[request]\nswarm_resource = ["DOCKER_RESOURCE_GPU"]\n'])
def test_an_images_swarm_variable_gets_no_more_gpus_through_the_shim(swarm: str, host: FakeHost, tmp_path: Path) -> None:
    """docker run --gpus device=0 of an image with ENV DOCKER_RESOURCE_GPU=all: GPU 0 only, in the
    device rules the shim writes and inside the container (before: every GPU, and rules for all)."""
    config = tmp_path / "config.toml"
    config.write_text(host.config_text() + swarm)
    bundle = oci_bundle(tmp_path, CUDACHECK_GPU0, env=["DOCKER_RESOURCE_GPU=all", "NVIDIA_VISIBLE_DEVICES=0"])
    result = shim(["--root", str(tmp_path / "state"), "run", "--bundle", str(bundle), unique()], config)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == EXPECTED_GPU0, result.stdout
    rules = json.loads((bundle / "config.json").read_text())["linux"]["resources"]["devices"]
    gpu_rules = [(r["major"], r["minor"]) for r in rules if r.get("allow") and r.get("major") == 195 and r.get("minor", 255) < 254]
    assert gpu_rules == [(195, host.gpu_list[0].minor)], rules


def test_other_bundles_and_calls_pass_through_untouched(host: FakeHost, tmp_path: Path) -> None:
    config = host.write_config()
    bundle = oci_bundle(tmp_path, ["/bin/echo", "plain"], env=["NVIDIA_VISIBLE_DEVICES=void"])
    before = (bundle / "config.json").read_bytes()
    result = shim(["--root", str(tmp_path / "state"), "run", "--bundle", str(bundle), unique()], config)
    assert result.returncode == 0 and result.stdout == "plain\n", result.stderr
    assert (bundle / "config.json").read_bytes() == before
    version = shim(["--version"], config)
    assert version.returncode == 0 and version.stdout.startswith("runc version")  # what engines parse, untouched
    assert version.stderr.startswith("ponytail-runtime ") and "shim in front of" in version.stderr  # and which shim
    assert not host.log.exists()


def test_shim_errors_are_one_line_in_stderr_and_in_the_runtime_log(host: FakeHost, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(host.config_text() + '[runtime]\npath = "/nonexistent/runc"\n')
    log = tmp_path / "log.json"
    result = shim(["--log", str(log), "--log-format", "json", "state", "x"], config)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "ponytail-runtime: runtime '/nonexistent/runc' not found" in result.stderr
    entry = json.loads(log.read_text())
    assert entry["level"] == "error" and entry["msg"] == result.stderr.strip()


BROKEN_CONFIGS = {
    "syntax": ("[host\n", "TOML syntax error"),
    "huge-integer": ("[timeouts]\nprobe = " + "1" * 4301 + "\n", "a value cannot be read"),  # ValueError in tomllib
    "unknown-key": ("[host]\ndriver_rot = '/'\n", "unknown key 'host.driver_rot'"),
}


@pytest.mark.parametrize("broken", BROKEN_CONFIGS)
def test_a_broken_config_stops_gpu_containers_only(broken: str, host: FakeHost, tmp_path: Path) -> None:
    text, message = BROKEN_CONFIGS[broken]
    config = tmp_path / "config.toml"
    config.write_text(text)
    plain = oci_bundle(tmp_path, ["/bin/echo", "plain"])
    result = shim(["--root", str(tmp_path / "state"), "run", "-b", str(plain), unique()], config)
    assert result.returncode == 0 and result.stdout == "plain\n", result.stderr
    gpu = oci_bundle(tmp_path, ["/bin/echo", "gpu"], env=["NVIDIA_VISIBLE_DEVICES=0"])
    result = shim(["--root", str(tmp_path / "state"), "run", "-b", str(gpu), unique()], config)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and f"ponytail-runtime: config file {config}: {message}" in result.stderr
