"""``ponytail cdi generate | list | check``: the spec is the plan as data, conforms to the CDI
specification (cncf-tags/container-device-interface SPEC.md) at the lowest version that holds
it, is deterministic and written atomically, and ``check`` notices when it goes stale."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from ponytail.plan.cdi import problems, required_version

from support.cdi_support import generate
from support.engines import console_script
from support.fakehost import FakeHost, gpus
from support.harness import run_ponytail

V = "550.54.15"
LIB = "/usr/lib/x86_64-linux-gnu"
# The specification's syntax, written from its text (not from ponytail's code):
# kind "vendor/class": the vendor a DNS subdomain, the class alphanumeric at both ends with - _ . between
# (a dot only from 0.6.0), at most 63 characters; a device name alphanumeric at both ends with - _ . :
# between, a leading digit only from 0.5.0.
VENDOR = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$")
CLASS_BEFORE_060 = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_-]{0,61}[A-Za-z0-9])?$")
NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
# fields each version introduced (SPEC.md, "Released versions")
INTRODUCED = {"hostPath": "0.5.0", "type-of-mount": "0.4.0", "annotations": "0.6.0", "intelRdt": "0.7.0", "additionalGids": "0.7.0", "netDevices": "1.1.0"}


# shared_host's: 3 GPUs, minors out of PCI order (index 0 is /dev/nvidia2), MIG on GPU 2 (minor 1)
HOST_SHAPE = {"gpu_list": gpus(3, minors=[2, 0, 1]), "mig": {1: [(1, 0), (2, 0)]}, "daemons": True}


def nodes(edits: dict) -> list[str]:
    return [n["path"] for n in edits.get("deviceNodes", [])]


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_spec_conforms_to_the_specification_at_its_lowest_version(shared_host: FakeHost, tmp_path: Path, suffix: str) -> None:
    spec = generate(shared_host, tmp_path / f"nvidia{suffix}")
    assert set(spec) == {"cdiVersion", "kind", "devices", "containerEdits"}
    vendor, _, klass = spec["kind"].partition("/")
    assert spec["kind"] == "nvidia.com/gpu" and VENDOR.match(vendor) and CLASS_BEFORE_060.match(klass)
    names = [d["name"] for d in spec["devices"]]
    assert [n for n in names if not n.startswith(("GPU-", "MIG-"))] == ["0", "1", "2", "2:1:0", "2:2:0", "all"]
    assert len(names) == 6 + 3 + 2  # by default every GPU and MIG device by UUID too
    assert all(NAME.match(n) for n in names) and len(set(names)) == len(names)
    # names starting with a digit and device nodes with a hostPath (the fake host's /dev is elsewhere)
    # are 0.5.0 features; nothing of 0.6.0 or later is used: 0.5.0 is the lowest that holds this spec
    assert any(n["hostPath"] for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"])
    assert spec["cdiVersion"] == "0.5.0"
    text = (tmp_path / f"nvidia{suffix}").read_text()
    assert "annotations" not in text and "intelRdt" not in text and "additionalGids" not in text and "netDevices" not in text
    assert all(not m.get("type") for m in spec["containerEdits"]["mounts"])
    for device in spec["devices"]:
        assert device["containerEdits"], device  # a device with no edits is invalid
    for edits in [spec["containerEdits"]] + [d["containerEdits"] for d in spec["devices"]]:
        for node in edits.get("deviceNodes", []):
            assert node["path"].startswith("/dev/") and node["type"] == "c" and set(node["permissions"]) <= set("rwm")
        for mount in edits.get("mounts", []):
            assert mount["hostPath"] and mount["containerPath"].startswith("/")
        for hook in edits.get("hooks", []):
            assert hook["hookName"] in ("createRuntime", "createContainer", "startContainer", "poststart", "poststop", "prestart")
            assert os.path.isabs(hook["path"])
        assert all("=" in e for e in edits.get("env", []))
    assert problems(spec) == []


def test_uuid_names_alone_need_no_digit_rule(shared_host: FakeHost, tmp_path: Path) -> None:
    spec = generate(shared_host, tmp_path / "nvidia.yaml", "--device-name-strategy", "uuid")
    names = [d["name"] for d in spec["devices"]]
    assert names[:3] == [g.uuid for g in shared_host.gpu_list] and names[-1] == "all"
    assert names[3:5] == [FakeHost.mig_uuid(1, 1, 0), FakeHost.mig_uuid(1, 2, 0)]  # MIG UUIDs, asked of NVML
    assert spec["cdiVersion"] == "0.5.0"  # still: the device nodes' hostPath
    both = generate(shared_host, tmp_path / "both.yaml", "--device-name-strategy", "both")
    assert [d["name"] for d in both["devices"]][:2] == ["0", shared_host.gpu_list[0].uuid]


def test_each_device_has_only_its_own_nodes_and_the_rest_is_shared(shared_host: FakeHost, tmp_path: Path) -> None:
    spec = generate(shared_host, tmp_path / "nvidia.json")
    devices = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    assert nodes(devices["0"]) == ["/dev/nvidia2"]  # index 0 is the GPU with minor 2
    assert nodes(devices["1"]) == ["/dev/nvidia0"]
    assert nodes(devices["2:1:0"]) == ["/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap145", "/dev/nvidia-caps/nvidia-cap146"]
    assert set(nodes(devices["all"])) == {"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2"} | {f"/dev/nvidia-caps/nvidia-cap{m}" for m in (145, 146, 150, 151)}
    assert devices["0"]["deviceNodes"][0] == {"path": "/dev/nvidia2", "hostPath": str(shared_host.dev / "nvidia2"), "type": "c", "major": 195, "minor": 2, "permissions": "rw"}
    shared = spec["containerEdits"]
    assert shared["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert nodes(shared) == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"]
    mounted = {m["containerPath"]: m for m in shared["mounts"]}
    assert mounted[f"{LIB}/libcuda.so.{V}"]["options"] == ["ro", "nosuid", "nodev", "bind"]
    assert mounted[f"/lib/firmware/nvidia/{V}/gsp_ga10x.bin"]["options"] == ["ro", "nosuid", "nodev", "noexec", "bind"]
    assert "/usr/bin/nvidia-smi" in mounted and "/run/nvidia-persistenced/socket" in mounted
    assert not any("535.104.05" in path for path in mounted)  # the stale driver's files stay out
    [hook] = shared["hooks"]
    assert hook["hookName"] == "createContainer" and hook["path"] == console_script("ponytail")
    args = hook["args"]
    assert args[:2] == ["ponytail", "cdi-hook"] and args[args.index("--driver-version") + 1] == V
    assert ["--link", f"{LIB}/libcuda.so.1", f"libcuda.so.{V}", str(shared_host.driver / LIB.lstrip("/") / f"libcuda.so.{V}")] == args[args.index("--link"):args.index("--link") + 4]
    assert "--mask-proc" in args and args[args.index("--ldconfig") + 2:args.index("--ldconfig") + 4] == ["--directory", LIB]


def test_the_same_host_gives_the_same_bytes_written_atomically(shared_host: FakeHost, tmp_path: Path) -> None:
    for name in ("a.yaml", "b.yaml", "a.json", "b.json"):
        generate(shared_host, tmp_path / name)
    assert (tmp_path / "a.yaml").read_bytes() == (tmp_path / "b.yaml").read_bytes()
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert (tmp_path / "a.yaml").stat().st_mode & 0o777 == 0o644
    generate(shared_host, tmp_path / "a.yaml")  # replaced in place, nothing left beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "a.yaml", "b.json", "b.yaml"]
    stdout = run_ponytail(["cdi", "generate", "-config", str(shared_host.write_config()), "--hook-path", console_script("ponytail")])
    assert stdout.returncode == 0 and stdout.stdout == (tmp_path / "a.yaml").read_bytes()


@pytest.mark.parametrize("version, ok", [("0.6.0", True), ("1.1.0", True), ("0.4.0", False), ("0.3.0", False), ("2.0.0", False)])
def test_spec_version_option(shared_host: FakeHost, tmp_path: Path, version: str, ok: bool) -> None:
    out = tmp_path / "nvidia.yaml"
    args = ["cdi", "generate", "-config", str(shared_host.write_config()), "--hook-path", console_script("ponytail"), "--output", str(out)]
    result = run_ponytail(args + ["--spec-version", version])
    if ok:
        assert result.returncode == 0, result.stderr
        assert f"cdiVersion: {version}" in out.read_text()
    else:
        assert result.returncode == 2 and not out.exists()
        assert len(result.stderr.decode().splitlines()) == 1 and "Traceback" not in result.stderr.decode()


def spec_with(**edits: object) -> dict:
    return {"cdiVersion": "1.1.0", "kind": "vendor.com/class", "devices": [{"name": "dev", "containerEdits": {"env": ["A=1"], **edits}}]}


@pytest.mark.parametrize("spec, expected", [
    (spec_with(), "0.3.0"),
    (spec_with(mounts=[{"hostPath": "/a", "containerPath": "/a", "type": "bind"}]), INTRODUCED["type-of-mount"]),
    (spec_with(deviceNodes=[{"path": "/dev/x", "hostPath": "/host/dev/x"}]), INTRODUCED["hostPath"]),
    ({**spec_with(), "devices": [{"name": "0", "containerEdits": {"env": ["A=1"]}}]}, "0.5.0"),
    ({**spec_with(), "annotations": {"a": "b"}}, INTRODUCED["annotations"]),
    ({**spec_with(), "kind": "vendor.com/cl.ass"}, "0.6.0"),
    (spec_with(additionalGids=[5]), INTRODUCED["additionalGids"]),
    (spec_with(intelRdt={"closID": "c"}), INTRODUCED["intelRdt"]),
    (spec_with(intelRdt={"schemata": ["L3:0=f"]}), "1.1.0"),
    (spec_with(netDevices=[{"hostInterfaceName": "eth1", "name": "eth1"}]), INTRODUCED["netDevices"]),
])
def test_the_lowest_version_is_the_one_that_introduced_the_newest_feature(spec: dict, expected: str) -> None:
    assert required_version(spec) == expected
    assert problems({**spec, "cdiVersion": expected}) == []
    if expected != "0.3.0":
        lower = ["0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0"]
        below = lower[lower.index(expected) - 1]
        assert any("too low" in p for p in problems({**spec, "cdiVersion": below}))


@pytest.mark.parametrize("change, message", [
    ({"cdiVersion": None}, "cdiVersion"),
    ({"cdiVersion": "0.2.0"}, "cdiVersion"),
    ({"kind": "foo"}, "vendor/class"),
    ({"kind": "vendor.com/foo/bar"}, "vendor/class"),
    ({"kind": "vendor.com/"}, "class"),
    ({"kind": "-vendor.com/foo"}, "vendor"),
    ({"devices": []}, "at least one device"),
    ({"devices": [{"name": "-x", "containerEdits": {"env": ["A=1"]}}]}, "device name"),
    ({"devices": [{"name": "a b", "containerEdits": {"env": ["A=1"]}}]}, "device name"),
    ({"devices": [{"name": "x", "containerEdits": {}}]}, "no container edits"),
    ({"devices": [{"name": "x", "containerEdits": {"env": ["A"]}}]}, "VAR=VALUE"),
    ({"devices": [{"name": "x", "containerEdits": {"deviceNodes": [{"path": "/dev/x", "permissions": "rx"}]}}]}, "permissions"),
    ({"devices": [{"name": "x", "containerEdits": {"mounts": [{"hostPath": "/a"}]}}]}, "containerPath"),
    ({"containerEdits": {"hooks": [{"hookName": "preStart", "path": "/bin/true"}]}}, "hook name"),
    ({"containerEdits": {"hooks": [{"hookName": "createContainer", "path": "true"}]}}, "absolute"),
    ({"extra": 1}, "unknown field"),
])
def test_what_the_specification_forbids_is_found(change: dict, message: str) -> None:
    assert any(message in p for p in problems({**spec_with(), **change})), problems({**spec_with(), **change})


def test_list_names_from_a_file_and_from_this_host(shared_host: FakeHost, tmp_path: Path) -> None:
    """By default `cdi generate` writes, and `cdi list` names, every GPU by index and by UUID (what
    Docker's --gpus device=UUID and the device plugin ask for), and 'all': the same names both ways."""
    generate(shared_host, tmp_path / "nvidia.json")
    from_file = run_ponytail(["cdi", "list", str(tmp_path / "nvidia.json")])
    assert from_file.returncode == 0, from_file.stderr
    names = from_file.stdout.decode().splitlines()
    assert [n for n in names if "GPU-" not in n and "MIG-" not in n] == [f"nvidia.com/gpu={n}" for n in ("0", "1", "2", "2:1:0", "2:2:0", "all")]
    assert sum(1 for n in names if n.startswith("nvidia.com/gpu=GPU-")) == 3 and sum(1 for n in names if "=MIG-" in n) == 2, names
    from_host = run_ponytail(["cdi", "list", "-config", str(shared_host.write_config())])
    assert from_host.returncode == 0 and from_host.stdout == from_file.stdout
    generate(shared_host, tmp_path / "index.json", "--device-name-strategy", "index")
    index = run_ponytail(["cdi", "list", "-config", str(shared_host.write_config()), "--device-name-strategy", "index"])
    assert index.returncode == 0 and index.stdout == run_ponytail(["cdi", "list", str(tmp_path / "index.json")]).stdout
    garbage = tmp_path / "bad.json"
    garbage.write_text('{"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": []}')
    bad = run_ponytail(["cdi", "list", str(garbage)])
    assert bad.returncode == 2 and "at least one device" in bad.stderr.decode()


@pytest.mark.parametrize("name, content", [
    ("truncated.json", b'{"cdiVersion": '), ("truncated.yaml", b"devices: [{name: a"), ("latin1.json", b'{"kind": "\xe9"}'),
    ("bad-date.yaml", b"cdiVersion: 2001-13-14"), ("bad-float.yaml", b"cdiVersion: !!float x"),
    ("python-tag.yaml", b"kind: !!python/object/apply:os.system [true]"),
    ("deep.json", b"[" * 100000), ("deep.yaml", b"[" * 100000),
])
def test_a_file_that_is_no_spec_is_one_line_and_exit_2(tmp_path: Path, name: str, content: bytes) -> None:
    """What JSON and YAML can raise on a bad file, and nothing else, is turned into that line."""
    (tmp_path / name).write_bytes(content)
    result = run_ponytail(["cdi", "list", str(tmp_path / name)])
    stderr = result.stderr.decode()
    assert result.returncode == 2 and stderr.count("\n") == 1, stderr
    assert stderr.startswith(f"ponytail: error: {tmp_path / name} is not a CDI spec: "), stderr


def test_check_says_when_the_spec_went_stale(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "host", gpu_list=gpus(2))
    spec = tmp_path / "nvidia.yaml"
    generate(host, spec)
    config = str(host.write_config())
    fresh = run_ponytail(["cdi", "check", "-config", config, str(spec)])
    assert fresh.returncode == 0 and b"up to date" in fresh.stdout, fresh.stdout + fresh.stderr
    # a driver upgrade: the module is 560 now, the spec still names 550's files
    version = host.proc / "driver/nvidia/version"
    version.write_text(version.read_text().replace(V, "560.35.03"))
    (host.driver / LIB.lstrip("/") / f"libnvidia-ml.so.{V}").unlink()
    stale = run_ponytail(["cdi", "check", "-config", config, str(spec)])
    out = stale.stdout.decode()
    assert stale.returncode == 1, out
    assert f"stale: the spec was made for driver {V}; the running driver is 560.35.03" in out
    assert f"libnvidia-ml.so.{V} (mounted at {LIB}/libnvidia-ml.so.{V}) no longer exists" in out
    assert "ponytail cdi generate" in stale.stderr.decode()
    (host.dev / "nvidia1").unlink()
    gone = run_ponytail(["cdi", "check", "-config", config, str(spec)])
    assert gone.returncode == 1 and "device node" in gone.stdout.decode() and "nvidia1 no longer exists" in gone.stdout.decode()
    spec.write_text("cdiVersion: [\n")
    invalid = run_ponytail(["cdi", "check", "-config", config, str(spec)])
    assert invalid.returncode == 2 and len(invalid.stderr.decode().splitlines()) == 1


def test_a_host_without_gpus_gets_no_spec(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "host", gpu_list=[])
    out = tmp_path / "nvidia.yaml"
    result = run_ponytail(["cdi", "generate", "-config", str(host.write_config()), "--output", str(out)])
    err = result.stderr.decode()
    assert result.returncode == 1 and "no GPU" in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_the_binary_writes_the_same_spec(shared_host: FakeHost, tmp_path: Path, binary: Path) -> None:
    """The binary carries its YAML library: the same host gives the same bytes from both forms."""
    args = ["cdi", "generate", "-config", str(shared_host.write_config()), "--hook-path", console_script("ponytail")]
    frozen = run_ponytail(args, command=[str(binary)])
    assert frozen.returncode == 0, frozen.stderr
    assert frozen.stdout == run_ponytail(args).stdout and frozen.stdout.startswith(b"cdiVersion: 0.5.0\n")


NAME_SYNTAX = {  # the CDI specification's name syntax, as regular expressions
    "_label": r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?",
    "_class": r"[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?",
    "_device_name": r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?",
}


@pytest.mark.unit
@pytest.mark.parametrize("check", sorted(NAME_SYNTAX))
def test_names_are_checked_as_the_specifications_syntax_says(check: str) -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    import ponytail.plan.cdi as cdi

    function, pattern = getattr(cdi, check), re.compile(NAME_SYNTAX[check])
    @given(st.text(alphabet="aZ09-_.:/ é\n\t", max_size=8))
    def agrees(text: str) -> None:
        assert function(text) == bool(pattern.fullmatch(text)), text

    agrees()


def test_check_calls_a_spec_without_the_node_record_stale(tmp_path: Path) -> None:
    """A spec an older ponytail wrote (its hook has --driver-version but no --gpu/--major): its
    hook cannot refuse renumbered GPUs, so check asks for it to be generated again."""
    host = FakeHost(tmp_path / "host", gpu_list=gpus(2))
    path = tmp_path / "nvidia.json"
    spec = generate(host, path)
    [hook] = spec["containerEdits"]["hooks"]
    args, kept = hook["args"], []
    i = 0
    while i < len(args):
        width = {"--gpu": 4, "--major": 3}.get(args[i], 1)
        kept += [] if width > 1 else [args[i]]
        i += width
    hook["args"] = kept
    path.write_text(json.dumps(spec))
    result = run_ponytail(["cdi", "check", "-config", str(host.write_config()), str(path)])
    assert result.returncode == 1 and "records no GPU minors or majors" in result.stdout.decode(), result.stdout


def test_each_gpu_device_makes_its_own_dri_by_path_links(tmp_path: Path) -> None:
    """graphics/display: a GPU's device entry has its /dev/dri nodes and a hook of its own that
    makes that GPU's /dev/dri/by-path links (and no other's); 'all' makes every GPU's; the
    shared hook makes none. Before, the by-path links of the plan were left out of the spec."""
    host = FakeHost(tmp_path / "host", gpu_list=gpus(2), dri=True)
    path = tmp_path / "nvidia.json"
    spec = generate(host, path)
    devices = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    config = str(host.write_config())

    def links(edits: dict) -> list[list[str]]:
        args = [a for hook in edits.get("hooks", []) for a in hook["args"]]
        return [args[i + 1:i + 3] for i, a in enumerate(args) if a == "--device-link"]

    bus = [g.bus_id for g in host.gpu_list]
    for index, (card, render) in enumerate([("card1", "renderD128"), ("card2", "renderD129")]):
        edits = devices[str(index)]
        assert set(nodes(edits)) == {f"/dev/nvidia{index}", f"/dev/dri/{card}", f"/dev/dri/{render}"}
        assert links(edits) == [[f"/dev/dri/by-path/pci-{bus[index]}-card", f"../{card}"], [f"/dev/dri/by-path/pci-{bus[index]}-render", f"../{render}"]]
        [hook] = edits["hooks"]
        assert hook["hookName"] == "createContainer" and hook["args"][:4] == ["ponytail", "cdi-hook", "-config", config]
        assert devices[host.gpu_list[index].uuid]["hooks"] == edits["hooks"]
    assert len(links(devices["all"])) == 4
    assert links(spec["containerEdits"]) == []
    assert spec["cdiVersion"] == "0.5.0" and problems(spec) == []  # a device's hooks are CDI from 0.3.0 on
    checked = run_ponytail(["cdi", "check", "-config", config, str(path)])  # the device hooks record no GPUs: still not stale
    assert checked.returncode == 0, checked.stdout.decode() + checked.stderr.decode()
