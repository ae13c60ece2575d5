"""NVIDIA's own tools (../shared/anchor's prebuilt tarball: nvidia-ctk and nvidia-cdi-hook 1.20.0, the
device plugin v0.20.0) against a fake host: its NVML replaced by bench/fake_nvml.c with the host's GPU
table compiled in, which is what nvidia-ctk asks (go-nvml). ``nvidia_spec`` is nvidia-ctk's own
``cdi generate`` for the host, its hooks pointed at a program of ours."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from support.fakehost import FakeHost

REPO = Path(__file__).resolve().parents[2]
TARBALL_NAMES = ("NVIDIA_TOOLS_TARBALL",)
DEFAULT_TARBALL = REPO.parent / "shared/anchor/nvidia-tools-x86_64.tar.xz"
_CACHE = Path(tempfile.gettempdir()) / "ponytail-test-nvidia-tools"


def nvidia_tools() -> Path:
    """The directory with NVIDIA's tools (bin/, lib/), unpacked once; skips the test without them."""
    tarball = Path(os.environ.get("NVIDIA_TOOLS_TARBALL", str(DEFAULT_TARBALL)))
    if (_CACHE / "bin/nvidia-ctk").exists():
        return _CACHE
    if not tarball.exists():
        pytest.skip(f"NVIDIA's prebuilt tools are not here ({tarball}; set NVIDIA_TOOLS_TARBALL)")
    work = Path(tempfile.mkdtemp(prefix="ponytail-test-nvidia-tools-"))
    subprocess.run(["tar", "-xJf", str(tarball), "-C", str(work)], check=True)
    try:
        work.rename(_CACHE)
    except OSError:  # unpacked meanwhile by another test process
        shutil.rmtree(work, ignore_errors=True)
    return _CACHE


def install_fake_nvml(host: FakeHost, extra_sources: tuple[Path, ...] = ()) -> None:
    """The driver root's libnvidia-ml replaced by bench/fake_nvml.c answering for ``host``'s GPUs
    (with ``extra_sources`` compiled in)."""
    rows = ", ".join(f'{{ {g.minor}, "{g.bus_id}", "{g.uuid}", "{g.model}" }}' for g in sorted(host.gpu_list, key=lambda g: g.bus_id))
    table = host.base / "fake-nvml-table.h"
    table.write_text(f"#define FAKE_GPUS {rows}\n")
    out = host.driver / host.lib_dir.lstrip("/") / f"libnvidia-ml.so.{host.driver_version}"
    out.unlink()
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O1", "-Wl,-soname,libnvidia-ml.so.1", f'-DDRIVER_VERSION="{host.driver_version}"',
         f"-DCUDA_VERSION_INT={host.cuda_version}", "-include", str(table), "-o", str(out), str(REPO / "bench/fake_nvml.c"), *map(str, extra_sources)],
        check=True,
    )


def nvidia_spec(host: FakeHost, out: Path, hook: str, env: dict[str, str] | None = None, ctk: str = "") -> dict:
    """``nvidia-ctk cdi generate`` (1.20) for ``host`` into ``out`` (YAML), every hook's path then
    ``hook`` with ``env`` added to its environment; ``ctk``: a path named nvidia-ctk to write the
    hooks in the older ``nvidia-ctk hook SUBCOMMAND`` form instead. The spec, as written."""
    tools = nvidia_tools()
    install_fake_nvml(host)
    generated = subprocess.run(
        [str(tools / "bin/nvidia-ctk"), "cdi", "generate", "--driver-root", str(host.driver), "--dev-root", str(host.base),
         "--nvidia-cdi-hook-path", hook, "--output", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert generated.returncode == 0, generated.stderr[-3000:]
    spec = yaml.safe_load(out.read_text())
    for edits in [spec["containerEdits"], *(d["containerEdits"] for d in spec["devices"])]:
        for entry in edits.get("hooks", []):
            assert entry["path"] == hook and entry["args"][0] == "nvidia-cdi-hook", entry
            if ctk:
                entry["path"], entry["args"] = ctk, ["nvidia-ctk", "hook", *entry["args"][1:]]
            entry["env"] = [*entry.get("env", []), *(f"{k}={v}" for k, v in (env or {}).items())]
    out.write_text(yaml.safe_dump(spec))
    return spec


DRA_VENDOR = "k8s.gpu.nvidia.com"


def dra_specs(spec: dict, claim_uid: str, hook: str) -> tuple[dict, dict]:
    """The two specs NVIDIA's DRA driver (k8s-dra-driver-gpu's gpu-kubelet-plugin) writes, made from
    nvidia-ctk's ``spec``: the base spec, kind k8s.gpu.nvidia.com/device, a device per GPU by its
    canonical name (gpu-0, gpu-1 ...) with the common edits (the hooks at the driver's hook path
    ``hook``), and one claim's spec, kind k8s.gpu.nvidia.com/claim, a device ``<claim uid>-gpu-N``
    per allocated GPU with the claim's own edits (an environment variable, and a hook of its own:
    a link, as a device's by-path hook is)."""
    base = {"cdiVersion": spec["cdiVersion"], "kind": f"{DRA_VENDOR}/device", "containerEdits": spec["containerEdits"],
            "devices": [{"name": f"gpu-{d['name']}", "containerEdits": d["containerEdits"]} for d in spec["devices"] if d["name"].isdecimal()]}
    hooks = base["containerEdits"].get("hooks", [])
    for entry in hooks:
        assert entry["args"][0] == "nvidia-cdi-hook", entry
        entry["path"] = hook
    claim = {"cdiVersion": spec["cdiVersion"], "kind": f"{DRA_VENDOR}/claim", "devices": [
        {"name": f"{claim_uid}-{d['name']}", "containerEdits": {
            "env": [f"DRA_CLAIM_UID={claim_uid}"],
            "hooks": [{"hookName": "createContainer", "path": hook, "env": hooks[0].get("env", []),
                       "args": ["nvidia-cdi-hook", "create-symlinks", "--link", f"{claim_uid}-{d['name']}::/etc/nvidia-dra-claim"]}],
        }} for d in base["devices"]]}
    return base, claim
