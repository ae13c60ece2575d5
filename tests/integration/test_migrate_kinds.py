"""``ponytail migrate --from nvidia`` beside the specs of other NVIDIA node daemons (captured ones, shared/nvidia):
the device plugin's (``k8s.device-plugin.nvidia.com/gpu``, hooks by ``/usr/bin/nvidia-ctk``) and the GPU
Operator's (``management.nvidia.com/gpu``) and the DRA driver's (``k8s.gpu.nvidia.com/device``, ``/claim``) are left alone, byte for byte, and the hook they name becomes
ponytail's hook script; only ``nvidia.com/gpu`` is replaced, by ponytail's spec under its own name. A spec in
/var/run/cdi (a tmpfs) gets a unit that writes it again at boot. Every refusal of ``--undo`` names the one
command that clears it, and that command does; then the undo gives back every byte."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ponytail.cdi.owners import scan

from support.engines import console_script
from support.fakehost import FakeHost, gpus
from support.harness import run_ponytail
from support.nvidia_toolkit import tree_bytes
from support.nvidia_tools import PLACEHOLDER, SPECS, dra_specs

NVIDIA_PROGRAM = b"#!/bin/sh\n# NVIDIA's program (stand-in)\nexit 0\n"
RUNTIME = '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]\nBinaryName = "/usr/bin/nvidia-container-runtime"\n'


def _captured(name: str, host: FakeHost, hook: str | None = None) -> str:
    if not (SPECS / name).is_file():
        pytest.skip(f"no captured spec {SPECS / name} (shared/nvidia beside the checkout)")
    text = (SPECS / name).read_text().replace(PLACEHOLDER, str(host.base.parent))
    return text.replace("/usr/bin/nvidia-cdi-hook", hook) if hook else text


def _node(tmp_path: Path, spec_dir: str) -> tuple[Path, Path, FakeHost]:
    """A node with NVIDIA's toolkit: its spec of nvidia.com/gpu in ``spec_dir``, the device plugin's and the
    Operator's specs in /var/run/cdi, nvidia-ctk and nvidia-cdi-hook in /usr/bin, containerd's nvidia runtime."""
    host = FakeHost(tmp_path / "fake/host", gpu_list=gpus(2))
    config = host.write_config()
    root = tmp_path / "root"
    for d in ("etc/cdi", "var/run/cdi", "usr/bin", "etc/containerd", "etc/systemd/system/multi-user.target.wants"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / spec_dir.lstrip("/") / "nvidia.yaml").write_text(_captured("2gpu-default.yaml", host))
    (root / "var/run/cdi/k8s.device-plugin.nvidia.com-gpu.yaml").write_text(
        _captured("2gpu-device-plugin-names.yaml", host, hook="/usr/bin/nvidia-ctk"))
    (root / "var/run/cdi/management.nvidia.com-gpu.yaml").write_text(_captured("2gpu-management.yaml", host))
    # the DRA driver's two specs (kinds k8s.gpu.nvidia.com/device and /claim), their hooks by its own path
    base, claim = dra_specs(yaml.safe_load(_captured("2gpu-default.yaml", host)), "c1a1m", "/usr/bin/nvidia-cdi-hook")
    (root / "var/run/cdi/k8s.gpu.nvidia.com-device_base.yaml").write_text(yaml.safe_dump(base))
    (root / "var/run/cdi/k8s.gpu.nvidia.com-claim_c1a1m.yaml").write_text(yaml.safe_dump(claim))
    for name in ("nvidia-ctk", "nvidia-cdi-hook"):
        (root / "usr/bin" / name).write_bytes(NVIDIA_PROGRAM)
        (root / "usr/bin" / name).chmod(0o755)
    (root / "etc/containerd/config.toml").write_text("version = 2\n" + RUNTIME)
    return root, config, host


def _migrate(root: Path, config: Path, *more: str) -> tuple[int, str, str]:
    done = run_ponytail(["migrate", "--from", "nvidia", "--root", str(root), "-config", str(config),
                         "--path", console_script("ponytail"), *more])
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def test_specs_of_other_kinds_are_left_alone_and_their_hooks_served(tmp_path: Path) -> None:
    root, config, _ = _node(tmp_path, "/etc/cdi")
    before = tree_bytes(root)
    kept = {p: p.read_bytes() for p in (root / "var/run/cdi").iterdir()}  # the plugin's, the Operator's, the DRA driver's

    status, out, err = _migrate(root, config)
    assert status == 0, err
    assert {p: p.read_bytes() for p in kept} == kept  # the plugin's and the Operator's names still resolve
    assert "k8s.device-plugin.nvidia.com/gpu) is left alone" in out and "management.nvidia.com/gpu) is left alone" in out
    assert not (root / "etc/cdi/nvidia.yaml").exists()
    ours = root / "etc/cdi/ponytail.yaml"
    assert "kind: nvidia.com/gpu" in ours.read_text()
    # the hooks the plugin's spec names (nvidia-ctk hook ...) and NVIDIA's spec's (nvidia-cdi-hook) run ponytail
    for name in ("nvidia-ctk", "nvidia-cdi-hook"):
        assert b"ponytail-hook-script" in (root / "usr/bin" / name).read_bytes(), name
    assert not (root / "etc/systemd/system/ponytail-cdi-spec.service").exists()  # /etc/cdi outlives a boot
    # one spec per kind: ponytail's check of the specs finds no clash
    kinds = sorted(f.kind for f in scan(str(root)))
    assert kinds == ["k8s.device-plugin.nvidia.com/gpu", "k8s.gpu.nvidia.com/claim", "k8s.gpu.nvidia.com/device",
                     "management.nvidia.com/gpu", "nvidia.com/gpu"], kinds

    status, out, err = _migrate(root, config, "--undo")
    assert status == 0, err
    assert tree_bytes(root) == before


def test_a_spec_in_run_is_written_again_at_boot_and_undo_names_each_remedy(tmp_path: Path) -> None:
    root, config, _ = _node(tmp_path, "/var/run/cdi")
    before = tree_bytes(root)
    status, _, err = _migrate(root, config)
    assert status == 0, err
    spec = root / "var/run/cdi/ponytail.yaml"
    unit = root / "etc/systemd/system/ponytail-cdi-spec.service"
    wants = root / "etc/systemd/system/multi-user.target.wants/ponytail-cdi-spec.service"
    assert spec.is_file() and not (root / "var/run/cdi/nvidia.yaml").exists()
    text = unit.read_text()
    assert f"ExecStart={console_script('ponytail')} cdi generate --output /var/run/cdi/ponytail.yaml -config {config}" in text
    assert "Before=containerd.service docker.service crio.service kubelet.service" in text
    assert wants.is_symlink() and str(wants.readlink()) == "/etc/systemd/system/ponytail-cdi-spec.service"

    # a reboot (/var/run emptied): the unit's command writes the very spec the migration left
    written = spec.read_bytes()
    spec.unlink()
    done = run_ponytail(["cdi", "generate", "--output", str(spec), "-config", str(config)])  # the unit's command, at the root
    assert done.returncode == 0, done.stderr.decode()
    assert spec.read_bytes() == written

    # NVIDIA's package removed: its /usr/bin/nvidia-cdi-hook went, ponytail's script with it
    hook = root / "usr/bin/nvidia-cdi-hook"
    script = hook.read_bytes()
    hook.unlink()
    status, _, err = _migrate(root, config, "--undo")
    assert status == 1 and f"run 'ponytail install-nvidia-hook --at /usr/bin/nvidia-cdi-hook --path {console_script('ponytail')}'" in err, err
    done = run_ponytail(["install-nvidia-hook", "--at", str(hook), "--path", console_script("ponytail")])
    assert done.returncode == 0, done.stderr.decode()
    assert hook.read_bytes() == script

    status, _, err = _migrate(root, config, "--undo")
    assert status == 0, err
    assert tree_bytes(root) == before
