"""[request] isolate_privileged: a privileged container gets every host device from the engine
(containerd's and Docker's WithHostDevices); with the policy on, the GPUs it was not allotted are
made unusable inside it (bound onto themselves with nodev: EACCES) and /proc/driver/nvidia/gpus
shows only its own. Real runc containers, the devices in linux.devices as the engines write them
for a privileged container; the host's /dev is never changed."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest

from support.engines import CUDACHECK_GPU0, EXPECTED_GPU0, hook_entry, oci_bundle, run_bundle
from support.fakehost import FakeHost, gpus
from support.harness import run_ponytail, state_for

ISOLATE = "[request]\nisolate_privileged = true\n"
ALL_CAPS = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_MKNOD", "CAP_SETGID", "CAP_SETUID", "CAP_SYS_ADMIN"]


def privileged_bundle(host: FakeHost, base: Path, args: list[str], env: list[str], config_extra: str, stages: tuple[str, ...] = ("prestart",)) -> Path:
    """A runc bundle as an engine writes one for a privileged container: CAP_SYS_ADMIN, every
    host NVIDIA node in linux.devices (runc makes them in the container's /dev), all devices allowed."""
    base.mkdir(parents=True, exist_ok=True)
    config = base / "ponytail.toml"
    config.write_text(host.config_text() + config_extra)
    bundle = oci_bundle(base, args, env=env, hooks={stage: [hook_entry(config)] for stage in stages})
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["capabilities"] = {key: ALL_CAPS for key in ("bounding", "effective", "permitted")}
    devices = []
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm", "nvidia-caps/nvidia-cap1"):
        st = os.stat(host.dev / name)
        devices.append({"path": f"/dev/{name}", "type": "c", "major": os.major(st.st_rdev), "minor": os.minor(st.st_rdev),
                        "fileMode": 0o666, "uid": 0, "gid": 0})
    spec["linux"]["devices"] = devices
    spec["linux"]["resources"]["devices"] = [{"allow": True, "access": "rwm"}]
    (bundle / "config.json").write_text(json.dumps(spec, indent=1))
    return bundle


def hidden(dry_run: str) -> list[str]:
    return [line.split()[1] for line in dry_run.splitlines() if line.strip().startswith("hide ")]


@pytest.mark.parametrize("stages", [("prestart",), ("prestart", "createRuntime")])
def test_a_privileged_container_keeps_only_its_allotted_gpu(host: FakeHost, tmp_path: Path, stages: tuple[str, ...]) -> None:
    config_access = "/dev/nvidia-caps/nvidia-cap1"  # MIG config access: not asked for
    bundle = privileged_bundle(host, tmp_path, [*CUDACHECK_GPU0, config_access], ["NVIDIA_VISIBLE_DEVICES=0"], ISOLATE, stages)
    result = run_bundle("runc", bundle)
    assert result.returncode == 0, result.stderr
    expected = [line.replace("ENOENT", "EACCES") if line.startswith(("open /dev/nvidia0", "open /dev/nvidia1")) else line for line in EXPECTED_GPU0]
    assert result.stdout.splitlines() == [*expected, f"open {config_access} EACCES"], result.stdout
    log = host.log.read_text()
    assert "hide /dev/nvidia0 (nodev: GPU 1 " in log and "hide /dev/nvidia1 (nodev: GPU 2 " in log, log[-2000:]
    if len(stages) > 1:  # the second run finds them hidden and changes nothing
        assert "/dev/nvidia0 (hidden already: nodev)" in log and "/dev/nvidia1 (hidden already: nodev)" in log, log[-2000:]
    # the host's nodes are as they were: still character devices, opened (ENXIO: no driver), not EACCES
    for name in ("nvidia0", "nvidia1"):
        assert stat.S_ISCHR(os.stat(host.dev / name).st_mode)
        with pytest.raises(OSError) as opened:
            os.open(host.dev / name, os.O_RDWR)
        assert opened.value.errno == errno.ENXIO
    assert str(host.dev) not in Path("/proc/self/mountinfo").read_text()


def test_without_the_policy_a_privileged_container_sees_every_gpu(host: FakeHost, tmp_path: Path) -> None:
    """The default (NVIDIA's behaviour too): the engine's nodes are left as they are."""
    bundle = privileged_bundle(host, tmp_path, CUDACHECK_GPU0, ["NVIDIA_VISIBLE_DEVICES=0"], "")
    result = run_bundle("runc", bundle)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-2:] == ["open /dev/nvidia0 ENXIO", "open /dev/nvidia1 ENXIO"], result.stdout


def test_the_dry_run_shows_what_is_hidden_and_only_for_privileged_containers(host: FakeHost, tmp_path: Path) -> None:
    bundle = privileged_bundle(host, tmp_path, ["/bin/true"], ["NVIDIA_VISIBLE_DEVICES=0"], ISOLATE)
    config = ["-config", str(tmp_path / "ponytail.toml"), "-debug"]
    output = run_ponytail(config, stdin=state_for(bundle, 1)).stdout.decode()
    # the other GPUs, and the MIG config/monitor access nodes it did not ask for
    assert hidden(output) == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"], output
    assert "not allotted: hidden from a privileged container ([request] isolate_privileged)" in output
    # /proc/driver/nvidia/gpus, masked for every container, shows the allotted GPU only (this machine has no
    # /proc/driver/nvidia for a real container to list: the mask itself is tested with the executor's tests)
    shown = [line.split()[1] for line in output.splitlines() if line.strip().startswith("file  gpus/")]
    assert shown == [f"gpus/{host.gpu_list[0].bus_id}/information"], output
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["env"] = [e for e in spec["process"]["env"] if not e.startswith("NVIDIA_")] + ["NVIDIA_VISIBLE_DEVICES=all"]
    (bundle / "config.json").write_text(json.dumps(spec))
    assert [n for n in hidden(run_ponytail(config, stdin=state_for(bundle, 1)).stdout.decode()) if "caps" not in n] == []  # every GPU is allotted
    spec["process"]["env"][-1] = "NVIDIA_VISIBLE_DEVICES=0"
    spec["process"]["capabilities"] = {"bounding": ["CAP_CHOWN"]}
    (bundle / "config.json").write_text(json.dumps(spec))
    assert hidden(run_ponytail(config, stdin=state_for(bundle, 1)).stdout.decode()) == []  # unprivileged: nodes absent anyway


def test_what_the_image_put_at_a_hidden_nodes_name_is_not_acted_on(host: FakeHost, tmp_path: Path) -> None:
    """Without a tmpfs /dev the image's own /dev is the container's: a symlink it planted at
    /dev/nvidia1 (to a host-looking path) is never followed nor mounted over; said in the log."""
    bundle = privileged_bundle(host, tmp_path, CUDACHECK_GPU0, ["NVIDIA_VISIBLE_DEVICES=0"], ISOLATE)
    spec = json.loads((bundle / "config.json").read_text())
    spec["mounts"] = [m for m in spec["mounts"] if m["destination"] != "/dev"]
    spec["linux"]["devices"] = [d for d in spec["linux"]["devices"] if d["path"] != "/dev/nvidia1"]
    (bundle / "config.json").write_text(json.dumps(spec, indent=1))
    (bundle / "rootfs/dev").mkdir(exist_ok=True)
    (bundle / "rootfs/etc").mkdir(exist_ok=True)
    (bundle / "rootfs/etc/secret").write_text("image file\n")
    os.symlink("/etc/secret", bundle / "rootfs/dev/nvidia1")
    result = run_bundle("runc", bundle)
    assert result.returncode == 0, result.stderr
    # nvidia0 (the engine's node) hidden; nvidia1 the image's symlink, which leads the container to its own
    # read-only /etc/secret (EROFS for O_RDWR): not ponytail's to touch
    assert "open /dev/nvidia0 EACCES" in result.stdout and "open /dev/nvidia1 Read-only file system" in result.stdout, result.stdout
    assert "/dev/nvidia1 is not the character device 195:1: left as it is" in host.log.read_text()
    assert os.readlink(bundle / "rootfs/dev/nvidia1") == "/etc/secret"


def test_mig_access_nodes_not_allotted_are_hidden_too(tmp_path: Path) -> None:
    """The MIG device 2:1:0 of GPU 2 (/dev/nvidia1): the other GPUs and the other MIG device's GPU
    and compute instance access nodes are hidden, and the MIG config/monitor nodes it did not ask for."""
    host = FakeHost(tmp_path / "host", gpu_list=gpus(3, minors=[2, 0, 1]), mig={1: [(1, 0), (2, 0)]})
    bundle = privileged_bundle(host, tmp_path, ["/bin/true"], [f"NVIDIA_VISIBLE_DEVICES={FakeHost.mig_uuid(1, 1, 0)}"], ISOLATE)
    output = run_ponytail(["-config", str(tmp_path / "ponytail.toml"), "-debug"], stdin=state_for(bundle, 1)).stdout.decode()
    other_gi, other_ci = FakeHost.mig_minors(1, 2, 0)
    assert hidden(output) == ["/dev/nvidia0", "/dev/nvidia2", "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2",
                              f"/dev/nvidia-caps/nvidia-cap{other_gi}", f"/dev/nvidia-caps/nvidia-cap{other_ci}"], output
    assert "MIG device 2:2:0: compute instance 0 access not allotted" in output
