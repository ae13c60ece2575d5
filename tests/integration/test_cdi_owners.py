"""ponytail beside NVIDIA's toolkit: nvidia-ctk's real spec (what nvidia-ctk 1.20.0 wrote, captured in ../shared/nvidia,
for a fake host laid out as its manifest says) is read as the CDI runtime reads it, checked, and never written over;
and ponytail never writes a second spec of a kind another file already defines (one owner per kind)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from support.cdi_support import generate
from support.engines import console_script
from support.fakehost import FakeHost
from support.harness import run_ponytail
from support.nvidia_tools import CAPTURED_HOOK, captured_host, spec_text
from support.nvidia_tools import nvidia_spec as captured_spec

MIGRATE = "ponytail migrate --from nvidia"


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return captured_host(tmp_path)


@pytest.fixture
def nvidia_spec(host: FakeHost, tmp_path: Path) -> Path:
    """nvidia-ctk's spec of the host where nvidia-ctk writes it: /etc/cdi/nvidia.yaml (under a fake root)."""
    spec = tmp_path / "root/etc/cdi/nvidia.yaml"
    hook = tmp_path / "bin/nvidia-cdi-hook"  # a hook program where the spec names it (ponytail's, as served)
    hook.parent.mkdir()
    hook.symlink_to(console_script("ponytail"))
    captured_spec(host, spec, str(hook))
    return spec


def test_nvidia_ctks_spec_omits_minor_zero_and_is_up_to_date(host: FakeHost, nvidia_spec: Path) -> None:
    spec = yaml.safe_load(nvidia_spec.read_text())
    first = next(d for d in spec["devices"] if d["name"] == "1")["containerEdits"]["deviceNodes"][0]  # NVML's index 1: minor 0
    assert first["path"] == "/dev/nvidia0" and "minor" not in first  # what the CDI runtime takes as 0
    checked = run_ponytail(["cdi", "check", "-config", str(host.write_config()), str(nvidia_spec)])
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.decode() == f"{nvidia_spec}: up to date\n"


@pytest.mark.parametrize("name, suffix", [("2gpu", "json"), ("18gpu", "yaml")])
def test_nvidia_ctks_other_captured_specs_are_up_to_date_on_their_hosts(tmp_path: Path, name: str, suffix: str) -> None:
    """nvidia-ctk 1.20.0's JSON spec, and its spec of 18 GPUs (37 devices), each on the host it was written for."""
    host = captured_host(tmp_path, name)
    hook = tmp_path / "usr/bin/nvidia-cdi-hook"
    hook.parent.mkdir(parents=True)
    hook.symlink_to(console_script("ponytail"))
    spec = tmp_path / f"etc/cdi/nvidia.{suffix}"
    spec.parent.mkdir(parents=True)
    spec.write_text(spec_text(tmp_path, name, suffix=suffix).replace(CAPTURED_HOOK, str(hook)))
    devices = (json.loads if suffix == "json" else yaml.safe_load)(spec.read_text())["devices"]
    assert len(devices) == 2 * len(host.gpu_list) + 1
    checked = run_ponytail(["cdi", "check", "-config", str(host.write_config()), str(spec)])
    assert checked.returncode == 0 and checked.stdout.decode() == f"{spec}: up to date\n", checked.stdout + checked.stderr


def test_a_stale_nvidia_spec_is_sent_to_nvidia_ctk_not_overwritten(host: FakeHost, nvidia_spec: Path) -> None:
    (host.dev / "nvidia1").unlink()
    checked = run_ponytail(["cdi", "check", "-config", str(host.write_config()), str(nvidia_spec)])
    err = checked.stderr.decode()
    assert checked.returncode == 1 and f"{host.dev}/nvidia1 no longer exists" in checked.stdout.decode()
    assert f"{nvidia_spec} (nvidia-ctk's) is stale" in err and f"nvidia-ctk cdi generate --output {nvidia_spec}" in err, err
    assert "ponytail cdi generate" not in err and MIGRATE in err


def test_check_reads_nvidia_ctks_spec_and_names_its_generator(host: FakeHost, nvidia_spec: Path, tmp_path: Path) -> None:
    config = str(host.write_config())
    report = json.loads(run_ponytail(["check", "-config", config, "--engine-root", str(tmp_path / "root"), "--json"]).stdout)
    cdi = [f for f in report["findings"] if f["subject"].startswith("CDI")]
    assert [f["level"] for f in cdi] == ["ok"], cdi
    assert f"{nvidia_spec} (nvidia-ctk's) is true for the running driver and GPUs" == cdi[0]["message"]
    (host.driver / host.lib_dir.lstrip("/") / f"libnvidia-ml.so.{host.driver_version}").unlink()  # an upgrade took it
    report = json.loads(run_ponytail(["check", "-config", config, "--engine-root", str(tmp_path / "root"), "--json"]).stdout)
    cdi = [f for f in report["findings"] if f["subject"].startswith("CDI")]
    assert [f["level"] for f in cdi] == ["problem"], cdi
    assert "nvidia-ctk cdi generate --output" in cdi[0]["message"] and "ponytail cdi generate" not in cdi[0]["message"]


def test_generate_never_writes_over_nvidias_spec(host: FakeHost, nvidia_spec: Path) -> None:
    before = nvidia_spec.read_bytes()
    args = ["cdi", "generate", "-config", str(host.write_config()), "--hook-path", console_script("ponytail")]
    over = run_ponytail([*args, "--output", str(nvidia_spec)])
    err = over.stderr.decode()
    assert over.returncode == 1 and err.count("\n") == 1, err
    assert f"{nvidia_spec} (nvidia-ctk's) is not ponytail's" in err and MIGRATE in err
    beside = nvidia_spec.parent / "ponytail.yaml"
    second = run_ponytail([*args, "--output", str(beside)])
    err = second.stderr.decode()
    assert second.returncode == 1 and err.count("\n") == 1, err
    assert f"not writing {beside}: {nvidia_spec} (nvidia-ctk's) already defines nvidia.com/gpu" in err
    assert "unresolvable CDI devices" in err and MIGRATE in err
    assert nvidia_spec.read_bytes() == before and not beside.exists()


def test_a_second_ponytail_spec_of_the_kind_is_refused_too(host: FakeHost, tmp_path: Path) -> None:
    ours = tmp_path / "ours.yaml"
    generate(host, ours)
    command = f"{console_script('ponytail')} cdi generate -config {host.write_config()} --hook-path {console_script('ponytail')}"
    made = _in_private_run(f"cp {ours} /run/cdi/nvidia.yaml && {command} --output /run/cdi/nvidia-again.json")
    assert made.returncode == 1, made.stderr
    assert "/var/run/cdi/nvidia.yaml (ponytail's) already defines nvidia.com/gpu" in made.stderr and "write to that file instead" in made.stderr
    again = _in_private_run(f"cp {ours} /run/cdi/nvidia.yaml && {command} --output /run/cdi/nvidia.yaml")
    assert again.returncode == 0, again.stderr  # its own file: regenerated in place


def _in_private_run(script: str) -> subprocess.CompletedProcess:
    """``script`` in a mount namespace of its own with a tmpfs on /run (so /var/run/cdi is private)."""
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", "mount -t tmpfs tmpfs /run && mkdir /run/cdi && " + script],
                          capture_output=True, text=True, timeout=120)


def test_generate_refuses_a_kind_another_spec_directory_has_and_list_shows_the_clash(host: FakeHost, nvidia_spec: Path, tmp_path: Path) -> None:
    ponytail = console_script("ponytail")
    config = host.write_config()
    ours = tmp_path / "ours.yaml"
    generate(host, ours)
    refused = _in_private_run(f"cp {nvidia_spec} /run/cdi/nvidia.yaml && {ponytail} cdi generate -config {config} --output {tmp_path}/cdi/nvidia.yaml")
    assert refused.returncode == 1, refused.stderr
    assert "not writing" in refused.stderr and "/var/run/cdi/nvidia.yaml (nvidia-ctk's) already defines nvidia.com/gpu" in refused.stderr
    listed = _in_private_run(f"cp {nvidia_spec} /run/cdi/nvidia.yaml && cp {ours} /run/cdi/ponytail.yaml && {ponytail} cdi list /run/cdi/ponytail.yaml")
    assert listed.returncode == 0 and "nvidia.com/gpu=0" in listed.stdout, listed.stderr
    clash = [line for line in listed.stderr.splitlines() if line.startswith("clash: ")]
    assert len(clash) == 1, listed.stderr
    assert "/var/run/cdi/nvidia.yaml (nvidia-ctk's) and /var/run/cdi/ponytail.yaml (ponytail's) both define nvidia.com/gpu" in clash[0]
    assert "unresolvable CDI devices" in clash[0] and MIGRATE in clash[0]


def test_check_finds_two_specs_of_one_kind(host: FakeHost, nvidia_spec: Path, tmp_path: Path) -> None:
    generate(host, tmp_path / "root/var/run/cdi/nvidia.yaml")
    report = json.loads(run_ponytail(["check", "-config", str(host.write_config()), "--engine-root", str(tmp_path / "root"), "--json"]).stdout)
    clash = [f for f in report["findings"] if f["subject"] == "CDI nvidia.com/gpu"]
    assert len(clash) == 1 and clash[0]["level"] == "problem", report["findings"]
    message = clash[0]["message"]
    assert f"{nvidia_spec} (nvidia-ctk's) and {tmp_path}/root/var/run/cdi/nvidia.yaml (ponytail's) both define nvidia.com/gpu" in message
    assert "later directory" in message and MIGRATE in message


def test_check_says_containerd_1_6_ignores_cdi_requests(host: FakeHost, tmp_path: Path) -> None:
    """Debian 12's containerd 1.6 (the machine's own program, asked its version only)."""
    version = subprocess.run(["containerd", "--version"], capture_output=True, text=True, check=False).stdout
    if " 1.6." not in version and " v1.6." not in version:
        pytest.skip(f"the containerd here is not 1.6: {version.strip()}")
    root = tmp_path / "root"
    (root / "etc/containerd").mkdir(parents=True)
    (root / "etc/containerd/config.toml").write_text("version = 2\n")
    args = ["check", "-config", str(host.write_config()), "--engine-root", str(root), "--engine", "containerd", "--json"]

    def finding() -> dict:
        report = json.loads(run_ponytail(args).stdout)
        found = [f for f in report["findings"] if f["subject"] == "containerd CDI"]
        assert len(found) == 1, report["findings"]
        return found[0]

    quiet = finding()  # no CDI spec waits: a note
    assert quiet["level"] == "ok" and "ignores the CDI devices of CRI requests" in quiet["message"]
    generate(host, root / "etc/cdi/nvidia.yaml")
    loud = finding()
    assert loud["level"] == "warning" and f"{root}/etc/cdi/nvidia.yaml will not be used" in loud["message"], loud
    assert "volume-mounts" in loud["message"]
