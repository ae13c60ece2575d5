"""The DRA plugin's pure parts: the .proto files read at run time (against protoc's reading), the
kernel log's Xid lines (real-world samples and garbage), the taint effects, a claim's allocation and
opaque config, and the ResourceSlice (checked by the stand-in API server's validator, which must
refuse what a real API server refuses)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ponytail.dra import health, protos
from ponytail.dra.claims import claim_work
from ponytail.dra.prepare import check_uid
from ponytail.dra.slices import device_entries, semver, slice_object
from ponytail.errors import InputError
from ponytail.host.mig import MigDevice
from ponytail.host.records import Gpu

from support.kube_api import Invalid, SchemaValidator, allocated_claim, validate_slice_rules

DRIVER = "gpu.ponytail.example.com"


@pytest.mark.parametrize("name", ["pluginregistration.proto", "dra_v1.proto", "dra_health.proto"])
def test_the_run_time_descriptors_are_protocs(name: str, tmp_path: object) -> None:
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    out = f"{tmp_path}/set.pb"
    assert protoc.main(["protoc", f"-I{protos.PROTO_DIR}", f"--descriptor_set_out={out}", name]) == 0
    with open(out, "rb") as f:
        [theirs] = descriptor_pb2.FileDescriptorSet.FromString(f.read()).file
    for service in theirs.service:
        for method in service.method:
            method.ClearField("options")  # protoc records the empty `{}` of each rpc
    with open(f"{protos.PROTO_DIR}/{name}") as f:
        assert protos.parse(f.read(), name) == theirs


def test_the_health_api_is_served_under_both_package_names() -> None:
    assert set(protos.load("dra_health.proto", "v1alpha1").services) == {"v1alpha1.DRAResourceHealth"}
    assert set(protos.load("dra_health.proto").services) == {"v1beta1.DRAResourceHealth"}


@pytest.mark.parametrize("line, expected", [
    ("3,1201,99887766,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.", ("0000:3b:00", 79, 0, "")),
    ("[ 1234.567890] NVRM: Xid (PCI:0000:01:00): 13, pid=12345, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): "
     "Out Of Range Address", ("0000:01:00", 13, 12345, "python3")),
    ("NVRM: Xid (PCI:0000:AF:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected",
     ("0000:af:00", 48, None, "<unknown>")),
    ("NVRM: Xid (PCI:0000:65:00): 31, pid=1234, name=python, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS",
     ("0000:65:00", 31, 1234, "python")),
    ("4,900,1,-;NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.", ("0000:3b:00", 79, None, "")),
])
def test_xid_lines_of_the_driver(line: str, expected: tuple) -> None:
    event = health.parse_kmsg(line)
    assert event is not None and (event.bus_id, event.xid, event.pid, event.process) == expected


@pytest.mark.parametrize("line", [
    "6,1,2,-;usb 1-1: new high-speed USB device", "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
    "NVRM: Xid (PCI:0000:3b:00): seventy-nine, pid=1", "NVRM: GPU at PCI:0000:3b:00: GPU-a1b2", " SUBSYSTEM=pci", "",
])
def test_other_kernel_lines_are_no_event(line: str) -> None:
    assert health.parse_kmsg(line) is None


@given(st.text())
def test_garbage_never_raises(line: str) -> None:
    health.parse_kmsg(line)
    health.parse_kmsg("NVRM: Xid (PCI:" + line)


def test_effects_follow_nvidias_classification_and_overrides() -> None:
    assert [health.effect_of(x, {}) for x in (13, 31, 79, 48, 62)] == ["None", "None", "NoExecute", "NoExecute", "NoSchedule"]
    overrides = health.parse_overrides(["13=NoSchedule", "79=None"])
    assert health.effect_of(13, overrides) == "NoSchedule" and health.effect_of(79, overrides) == "None"
    with pytest.raises(ValueError, match="XID=EFFECT"):
        health.parse_overrides(["79=Evict"])
    assert health.matches_bus("0000:3b:00", "0000:3B:00.0") and not health.matches_bus("0000:3b:00", "0000:3c:00.0")


def test_a_claims_work_merges_class_then_claim_config() -> None:
    claim = allocated_claim("ns", "c", "u1", DRIVER, "node", ["gpu-0", "gpu-1"], {"driverTree": "r560", "require": "cuda>=12.4"})
    claim["status"]["allocation"]["devices"]["config"].insert(0, {"source": "FromClass", "opaque": {
        "driver": DRIVER, "parameters": {"apiVersion": f"{DRIVER}/v1", "kind": "GpuConfig", "capabilities": "compute", "driverTree": "r550"}}})
    claim["status"]["allocation"]["devices"]["results"].append({"request": "gpu", "driver": "other.example.com", "pool": "node", "device": "x"})
    work = claim_work(claim, "u1", DRIVER, "node")
    assert [d.device for d in work.devices] == ["gpu-0", "gpu-1"]
    assert (work.driver_tree, work.capabilities, work.require) == ("r560", "compute", "cuda>=12.4")


@pytest.mark.parametrize("parameters, message", [
    ({"apiVersion": "other/v1"}, "not gpu.ponytail.example.com/v1"),
    ({"kind": "TimeSlicing"}, "not GpuConfig"),
    ({"driverTree": ["a"]}, "must be a string"),
    ({"sharing": {}}, "unknown field(s) sharing"),
    ("r560", "must be an object"),
])
def test_a_bad_opaque_config_is_one_line(parameters: object, message: str) -> None:
    claim = allocated_claim("ns", "c", "u1", DRIVER, "node", ["gpu-0"])
    claim["status"]["allocation"]["devices"]["config"] = [{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": parameters}}]
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        claim_work(claim, "u1", DRIVER, "node")


@pytest.mark.parametrize("uid", ["../../etc/passwd", "", "A" * 3, "x/y", "-rf", "a" * 65])
def test_a_claim_uid_must_be_a_plain_name(uid: str) -> None:
    with pytest.raises(InputError):
        check_uid(uid)


def test_versions_become_semantic_versions() -> None:
    assert [semver(v) for v in ("550.54.15", "535.104.05", "12.4", "9.0", "")] == ["550.54.15", "535.104.5", "12.4.0", "9.0.0", "0.0.0"]


GPUS = (
    Gpu(0, 1, "0000:18:00.0", "GPU-00000000-1111-2222-3333-000000000001", "NVIDIA H100 80GB HBM3"),
    Gpu(1, 0, "0000:28:00.0", "GPU-00000001-1111-2222-3333-000000000000", "NVIDIA A100-SXM4-40GB", True,
        (MigDevice(1, 1, 0, 12, 13), MigDevice(1, 2, 0, 21, 22))),
)


def test_the_slice_is_what_the_api_server_accepts() -> None:
    entries = device_entries(GPUS, "535.104.05", "12.2", ["r550", "r560-nightly"])
    assert [e.name for e in entries] == ["gpu-0", "gpu-1-mig-1-0", "gpu-1-mig-2-0"]
    obj = slice_object(DRIVER, "node-1", 1, entries, {"gpu-0": [{"key": f"{DRIVER}/xid", "value": "79", "effect": "NoExecute",
                                                                 "timeAdded": "2026-01-01T00:00:00Z"}]})
    SchemaValidator().validate(obj, "ResourceSlice")
    validate_slice_rules(obj)
    attributes = obj["spec"]["devices"][1]["attributes"]
    assert attributes["parentUUID"] == {"string": GPUS[1].uuid} and attributes["driverVersion"] == {"version": "535.104.5"}
    assert attributes["driverTrees"] == {"string": "r550,r560-nightly"} and "uuid" not in attributes


@pytest.mark.parametrize("change, refused", [
    (lambda d: d.update(basic={"attributes": {}}), "unknown field 'basic'"),  # v1beta1's shape, gone in v1
    (lambda d: d["attributes"].update(driverVersion={"version": "535.104.05"}), "not a semantic version"),
    (lambda d: d["attributes"].update(index={"int": 0, "string": "0"}), "exactly one value"),
    (lambda d: d["attributes"].update(index={"int": "0"}), "is not an integer"),
    (lambda d: d["attributes"].update({"driver-trees": {"string": "x"}}), "not a C identifier"),
    (lambda d: d["attributes"].update({f"a{i}": {"int": i} for i in range(30)}), "more than 32"),
    (lambda d: d.update(name="GPU_0"), "not a DNS label"),
    (lambda d: d.update(taints=[{"key": "x", "effect": "Evict"}]), "effect 'Evict'"),
])
def test_the_validator_refuses_what_an_api_server_refuses(change: object, refused: str) -> None:
    obj = slice_object(DRIVER, "node-1", 1, device_entries(GPUS[:1], "550.54.15", "12.4", []), {})
    change(obj["spec"]["devices"][0])  # type: ignore[operator]
    with pytest.raises(Invalid, match=refused):
        SchemaValidator().validate(obj, "ResourceSlice")
        validate_slice_rules(obj)


def _documents(path: str) -> list[dict]:
    import yaml

    from support.commands import REPO

    return [d for d in yaml.safe_load_all((REPO / path).read_text()) if d]


def test_the_dra_manifests_are_what_the_api_server_and_the_plugin_expect() -> None:
    documents = {(d["kind"], d["metadata"]["name"]): d for d in _documents("deploy/kubernetes/ponytail-dra.yaml")}
    types = {e.attributes["type"]["string"] for e in device_entries(GPUS, "550.54.15", "12.4", [])}
    for name, kind in (("gpu.ponytail.example.com", "gpu"), ("mig.gpu.ponytail.example.com", "mig")):
        device_class = documents[("DeviceClass", name)]
        SchemaValidator().validate(device_class, "DeviceClass")
        expression = device_class["spec"]["selectors"][0]["cel"]["expression"]
        assert f"device.driver == '{DRIVER}'" in expression and f".type == '{kind}'" in expression and kind in types
    rules = {(r["resources"][0], tuple(r["verbs"])) for r in documents[("ClusterRole", "ponytail-dra")]["rules"]}
    assert ("resourceclaims", ("get",)) in rules and any(r == "resourceslices" and "create" in v and "delete" in v for r, v in rules)
    container = documents[("DaemonSet", "ponytail-dra")]["spec"]["template"]["spec"]["containers"][0]
    assert "dra-plugin --service-account-dir" in container["args"][0] and {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in container["env"]


def test_no_manifest_waits_for_a_label_only_nvidias_feature_discovery_sets() -> None:
    for path in ("deploy/kubernetes/ponytail-installer.yaml", "deploy/kubernetes/ponytail-dra.yaml"):
        for document in _documents(path):
            if document["kind"] == "RuntimeClass":
                assert "scheduling" not in document
            if document["kind"] == "DaemonSet":
                pod = document["spec"]["template"]["spec"]
                assert "nodeSelector" not in pod
                terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
                assert len(terms) == 3 and {"key": "ponytail.example.com/gpu", "operator": "In", "values": ["true"]} in [t["matchExpressions"][0] for t in terms]


def test_the_service_account_is_read_from_the_directory_given(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """The DaemonSet runs the plugin in the host's mount namespace: the pod's token and CA come by path."""
    from pathlib import Path

    from ponytail.dra.kube import Kube, KubeError

    account = Path(str(tmp_path))
    (account / "token").write_text("secret-token\n")
    (account / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    configuration = Kube(service_account_dir=str(account)).api.configuration
    assert configuration.host == "https://10.96.0.1:443" and configuration.ssl_ca_cert == str(account / "ca.crt")
    assert "secret-token" in str(configuration.api_key)
    (account / "token").unlink()
    with pytest.raises(KubeError, match="--service-account-dir"):
        Kube(service_account_dir=str(account))


def test_the_systemd_unit_runs_the_plugin_and_is_not_packaged() -> None:
    from support.commands import REPO

    unit = (REPO / "deploy/systemd/ponytail-dra-plugin.service").read_text()
    assert "ExecStart=/usr/bin/ponytail dra-plugin\n" in unit and "Environment=NODE_NAME=" in unit and "Environment=KUBECONFIG=" in unit
    # debian/rules installs every packaging/systemd unit, and debhelper enables and starts what it installs
    assert not (REPO / "packaging/systemd/ponytail-dra-plugin.service").exists()


def test_a_background_loop_that_fails_is_said_and_started_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The resync, events and kernel-log loops outlive an error they did not expect: one line, then again."""
    import threading
    from types import SimpleNamespace

    from ponytail.dra import server

    monkeypatch.setattr(server, "RETRY_S", 0.0)
    said: list[str] = []
    plugin = SimpleNamespace(stopping=threading.Event(), say=said.append)
    runs: list[int] = []

    def loop() -> None:
        runs.append(1)
        if len(runs) == 1:
            raise OSError(5, "Input/output error")

    server.Plugin._kept(plugin, loop)  # type: ignore[arg-type]
    assert len(runs) == 2 and len(said) == 1 and "failed: OSError" in said[0] and "starting it again" in said[0], said
