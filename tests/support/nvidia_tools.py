"""NVIDIA's behaviour as captured data (``../shared/nvidia``, README there): the specs nvidia-ctk 1.20.0
wrote for two fake hosts, and the manifests of those hosts. ``captured_host`` lays a fake host out as
a manifest says; ``nvidia_spec`` is nvidia-ctk's spec for it (``@FAKEHOST@`` replaced), its hooks
pointed at a program of ours. Nothing here runs NVIDIA's programs: ``installed_toolkit`` finds them
where a node has them installed, for the tests that compare with them.

No pytest here: a booted node or a script lays out the same host with ``captured_host(root)`` and
``write_spec``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import yaml

from support.fakehost import FakeGpu, FakeHost, compile_library, compile_program

REPO = Path(__file__).resolve().parents[2]


def _shared() -> Path:
    """The shared folder beside the checkout (beside the main checkout, for a git worktree)."""
    beside = REPO.parent / "shared"
    dotgit = REPO / ".git"
    if not beside.is_dir() and dotgit.is_file() and dotgit.read_text().startswith("gitdir:"):
        common = Path(dotgit.read_text().split(":", 1)[1].strip()).parents[1]  # <main>/.git/worktrees/NAME -> <main>/.git
        return common.parent.parent / "shared"
    return beside


CAPTURED = Path(os.environ.get("PONYTAIL_NVIDIA_CAPTURED", str(_shared() / "nvidia")))
SPECS = CAPTURED / "specs-1.20.0"
HELP = CAPTURED / "help-1.20.0"
PLACEHOLDER = "@FAKEHOST@"
CAPTURED_HOOK = "/usr/bin/nvidia-cdi-hook"  # the hook path the captured specs name
STALE_VERSION = "535.104.05"  # the stale libnvidia-ml beside the driver's (left out of every spec)
# the captured specs: (host, variant) -> file; variants of 2gpu only but "default"
VARIANTS = ("default", "with-nvidia-smi", "device-plugin-names", "management")
DEVICE_PLUGIN_KIND = "k8s.device-plugin.nvidia.com/gpu"
MANAGEMENT_KIND = "management.nvidia.com/gpu"


def _captured(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"NVIDIA's captured data is not at {path} (the shared folder beside the checkout; set PONYTAIL_NVIDIA_CAPTURED)")
    return path


def manifest(name: str = "2gpu") -> dict:
    """The fake host's manifest (``2gpu`` or ``18gpu``), ``@FAKEHOST@`` left in."""
    result: dict = json.loads(_captured(SPECS / f"{name}-fakehost-manifest.json").read_text())
    return result


def captured_host(root: Path, name: str = "2gpu") -> FakeHost:
    """The fake host of manifest ``name`` laid out under ``root`` (``root`` stands for ``@FAKEHOST@``:
    root/host/{dev,driver,proc,sys}): its GPUs (bus id, minor, UUID, model), the driver's libraries
    with their SONAMEs in the manifest's library directory, nvidia-smi where it says, the device
    majors, the GSP firmware the specs mount and the stale libnvidia-ml beside the driver's."""
    info = manifest(name)
    version = info["driver_version"]
    host = FakeHost(
        root / "host", driver_version=version, lib_dir=info["libdir"], stale_versions=(), with_smi=False,
        cuda_version=info["cuda_driver_api"], uvm_major=info["uvm_major"], caps_major=info["caps_major"],
        gpu_list=[FakeGpu(g["pci_bus_id"], g["minor"], g["uuid"], g["model"]) for g in sorted(info["gpus"], key=lambda g: g["index"])],
    )
    libdir = host.driver / info["libdir"].lstrip("/")
    for lib in info["libs"]:
        target = host.driver / lib["file"].lstrip("/")
        if not target.exists():  # libcuda and libnvidia-ml: FakeHost's own
            shutil.copy(compile_library("fake_plain.c", lib["soname"], target.name, version), target)
    stale = compile_library("fake_libnvidia_ml.c", "libnvidia-ml.so.1", f"libnvidia-ml.so.{STALE_VERSION}", STALE_VERSION,
                            nvml_table=str(host.nvml_table))
    shutil.copy(stale, libdir / stale.name)
    smi = host.driver / info["nvidia_smi"].lstrip("/")
    smi.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(compile_program("fake_nvidia_smi.c"), smi)
    firmware = host.driver / "lib/firmware/nvidia" / version
    firmware.mkdir(parents=True, exist_ok=True)
    for blob in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
        (firmware / blob).write_bytes(b"GSP" + version.encode())
    subprocess.run(["ldconfig", "-r", str(host.driver)], check=True)  # the SONAME links and cache, with the stale library
    return host


def spec_text(root: Path, name: str = "2gpu", variant: str = "default", suffix: str = "yaml") -> str:
    """The captured spec ``name``-``variant`` with ``@FAKEHOST@`` replaced by ``root``."""
    return _captured(SPECS / f"{name}-{variant}.{suffix}").read_text().replace(PLACEHOLDER, str(root))


def host_name(host: FakeHost) -> str:
    """Which manifest ``host`` was laid out from (``captured_host``); ValueError for any other host."""
    for name in ("2gpu", "18gpu"):
        info = manifest(name)
        if host.base.name == "host" and {g.uuid for g in host.gpu_list} == {g["uuid"] for g in info["gpus"]} and host.lib_dir == info["libdir"]:
            return name
    raise ValueError(f"{host.base} is not a captured host: lay it out with support.nvidia_tools.captured_host")


def point_hooks(spec: dict, hook: str, env: dict[str, str] | None = None, ctk: str = "") -> dict:
    """Every hook of ``spec`` run by ``hook`` (with ``env`` added to its environment); ``ctk``: a path
    named nvidia-ctk, for the older ``nvidia-ctk hook SUBCOMMAND`` form instead."""
    for edits in [spec.get("containerEdits", {}), *(d["containerEdits"] for d in spec["devices"])]:
        for entry in edits.get("hooks", []):
            assert entry["path"] == CAPTURED_HOOK and entry["args"][0] == "nvidia-cdi-hook", entry
            entry["path"] = hook
            if ctk:
                entry["path"], entry["args"] = ctk, ["nvidia-ctk", "hook", *entry["args"][1:]]
            entry["env"] = [*entry.get("env", []), *(f"{k}={v}" for k, v in (env or {}).items())]
    return spec


def relocate(spec: dict, old: str, new: str) -> dict:
    """``spec`` with the container's side of directory ``old`` moved to ``new`` (mount targets, hook
    arguments, environment), host paths left as they are: the captured spec as if the driver's libraries
    went to another directory of the image (e.g. the one the hostile-image suite sets its traps in)."""

    def moved(text: str) -> str:
        return text.replace(f"::{old}/", f"::{new}/").replace(f"={old}", f"={new}") if not text.startswith(old) else new + text[len(old):]

    for edits in [spec.get("containerEdits", {}), *(d["containerEdits"] for d in spec["devices"])]:
        for mount in edits.get("mounts", []):
            mount["containerPath"] = moved(mount["containerPath"])
        for entry in edits.get("hooks", []):
            entry["args"] = [moved(a) for a in entry["args"]]
        if "env" in edits:
            edits["env"] = [moved(e) for e in edits["env"]]
    return spec


def _gpu_node(path: str, host_path: str, major: int, minor: int) -> dict:
    """A device node as nvidia-ctk writes it (no ``minor`` when it is 0)."""
    node: dict = {"path": path, "hostPath": host_path, "major": major}
    if minor:
        node["minor"] = minor
    return {**node, "fileMode": 438, "permissions": "rwm"}


def derived_spec(host: FakeHost, variant: str = "default") -> dict:
    """The captured 2-GPU spec ``variant`` made to fit another fake host by editing its data: the host's GPUs
    (named by NVML's index, in bus-id order, and UUID, as nvidia-ctk names them), library directory, driver
    version and uvm major; mounts, nodes and links of files the host lacks left out."""
    info = manifest("2gpu")
    text = _captured(SPECS / f"2gpu-{variant}.yaml").read_text().replace(f"{PLACEHOLDER}/host", str(host.base))
    text = text.replace(info["libdir"], host.lib_dir).replace(info["driver_version"], host.driver_version)
    spec = yaml.safe_load(text)
    libdir = host.driver / host.lib_dir.lstrip("/")
    edits = spec["containerEdits"]
    edits["mounts"] = [m for m in edits.get("mounts", []) if Path(m["hostPath"]).exists()]
    for node in edits.get("deviceNodes", []):
        if node["path"].startswith("/dev/nvidia-uvm"):
            node["major"] = host.uvm_major
    edits["deviceNodes"] = [n for n in edits.get("deviceNodes", []) if Path(n["hostPath"]).exists()]
    for entry in edits.get("hooks", []):
        args, kept = entry["args"], []
        for i, arg in enumerate(args):
            if arg != "--link" and (i == 0 or args[i - 1] != "--link"):
                kept.append(arg)
            elif arg != "--link" and (libdir / arg.partition("::")[0]).exists():
                kept += ["--link", arg]
        entry["args"] = kept
    ordered = sorted(host.gpu_list, key=lambda g: g.bus_id)
    nodes = {g.uuid: _gpu_node(f"/dev/nvidia{g.minor}", str(host.dev / f"nvidia{g.minor}"), 195, g.minor) for g in ordered}
    names = {d["name"] for d in spec["devices"]}
    devices: list[dict] = []
    if "0" in names:
        devices += [{"name": str(i), "containerEdits": {"deviceNodes": [dict(nodes[g.uuid])]}} for i, g in enumerate(ordered)]
    if any(n.startswith("GPU-") for n in names):
        devices += [{"name": g.uuid, "containerEdits": {"deviceNodes": [dict(nodes[g.uuid])]}} for g in ordered]
    for device in spec["devices"]:
        if device["name"] == "all":
            others = [n for n in device["containerEdits"]["deviceNodes"] if not n["path"][len("/dev/nvidia"):].isdecimal()]
            for node in others:
                if node["path"].startswith("/dev/nvidia-uvm"):
                    node["major"] = host.uvm_major
            gpu_nodes = [dict(n) for n in sorted(nodes.values(), key=lambda n: n.get("minor", 0))]
            device["containerEdits"]["deviceNodes"] = [n for n in others if Path(n["hostPath"]).exists()] + gpu_nodes
            devices.append(device)
    spec["devices"] = sorted(devices, key=lambda d: d["name"])
    return spec


def write_spec(host: FakeHost, out: Path, hook: str, env: dict[str, str] | None = None, ctk: str = "", variant: str = "default") -> dict:
    """nvidia-ctk 1.20.0's spec (captured ``variant``) for ``host`` written to ``out`` (YAML) with its hooks
    pointed at ``hook`` (see ``point_hooks``): the captured spec itself for a captured host, else the
    captured 2-GPU spec made to fit ``host`` (``derived_spec``). The spec, as written."""
    try:
        spec = yaml.safe_load(spec_text(host.base.parent, host_name(host), variant))
    except ValueError:
        spec = derived_spec(host, variant)
    point_hooks(spec, hook, env, ctk)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(spec))
    return spec


def nvidia_spec(host: FakeHost, out: Path, hook: str, env: dict[str, str] | None = None, ctk: str = "", variant: str = "default") -> dict:
    """What ``nvidia-ctk cdi generate`` (1.20.0) writes for ``host``, from the captured data (``write_spec``:
    exactly for a ``captured_host``, made to fit by editing data for another), into ``out``: every hook's path then ``hook`` with ``env`` added to its environment; ``ctk``: a
    path named nvidia-ctk to write the hooks in the older ``nvidia-ctk hook SUBCOMMAND`` form instead."""
    return write_spec(host, out, hook, env, ctk, variant)


TOOL_BINARIES = ("nvidia-ctk", "nvidia-cdi-hook", "nvidia-container-runtime-hook", "nvidia-container-runtime", "nvidia-container-cli")


def installed_toolkit() -> Path | None:
    """The directory of NVIDIA's installed programs (all of TOOL_BINARIES, from NVIDIA's packages):
    $NVIDIA_TOOLKIT_DIR (or its bin/), else nvidia-ctk's directory on PATH; None where the toolkit is not
    installed (a test comparing with NVIDIA's programs then skips that comparison, saying so)."""
    candidates = []
    if os.environ.get("NVIDIA_TOOLKIT_DIR"):
        candidates += [Path(os.environ["NVIDIA_TOOLKIT_DIR"]), Path(os.environ["NVIDIA_TOOLKIT_DIR"]) / "bin"]
    on_path = shutil.which("nvidia-ctk")
    if on_path:
        candidates.append(Path(on_path).parent)
    return next((d for d in candidates if all(os.access(d / n, os.X_OK) for n in TOOL_BINARIES)), None)


def install_fake_nvml(host: FakeHost, extra_sources: tuple[Path, ...] = ()) -> None:
    """The driver root's libnvidia-ml replaced by bench/fake_nvml.c answering for ``host``'s GPUs
    (with ``extra_sources`` compiled in): what NVIDIA's own programs ask NVML, for a node that runs them."""
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
