"""``ponytail dra-plugin`` against a stand-in kubelet and API server on a fake host: registration,
the node's ResourceSlice (validated as the API server validates it), prepare and unprepare with the
checkpoint, a claim that cannot work, a plugin killed mid-prepare, and GPU health from the kernel log."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.commands import PONYTAIL
from support.dra import DRIVER, NODE, DraNode
from support.fakehost import FakeHost, gpus
from support.kube_api import allocated_claim

UID1 = "0f0e0d0c-0000-4000-8000-000000000001"
UID2 = "0f0e0d0c-0000-4000-8000-000000000002"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[DraNode]:
    host = FakeHost(tmp_path / "host", gpu_list=gpus(2, minors=[1, 0]))
    n = DraNode(host, tmp_path)
    yield n
    n.close()


def test_registers_and_publishes_the_gpus_as_a_valid_resource_slice(node: DraNode) -> None:
    node.start()
    assert node.kubelet.info.name == DRIVER and node.kubelet.info.endpoint.endswith("/dra.sock")
    node.wait_log("registered with the kubelet")
    found = node.slice()
    assert node.api.refused == []
    spec = found["spec"]
    assert spec["driver"] == DRIVER and spec["nodeName"] == NODE and spec["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    by_name = {d["name"]: d["attributes"] for d in spec["devices"]}
    assert sorted(by_name) == ["gpu-0", "gpu-1"]
    gpu0 = by_name["gpu-0"]
    assert gpu0["uuid"] == {"string": node.host.gpu_list[0].uuid} and gpu0["minor"] == {"int": 1} and gpu0["index"] == {"int": 0}
    assert gpu0["driverVersion"] == {"version": "550.54.15"} and gpu0["cudaDriverVersion"] == {"version": "12.4.0"}
    assert gpu0["resource.kubernetes.io/pciBusID"] == {"string": node.host.gpu_list[0].bus_id}
    assert gpu0["productName"] == {"string": "NVIDIA H100 80GB HBM3"} and gpu0["cudaComputeCapability"] == {"version": "9.0.0"}


def _prepared(response: object, uid: str) -> tuple[list[str], str]:
    result = response.claims[uid]  # type: ignore[attr-defined]
    return [i for d in result.devices for i in d.cdi_device_ids], result.error


def test_prepare_writes_one_spec_per_claim_is_idempotent_and_unprepare_removes_exactly_it(node: DraNode) -> None:
    node.start()
    node.api.add_claim(allocated_claim("default", "one", UID1, DRIVER, NODE, ["gpu-1"]))
    node.api.add_claim(allocated_claim("team", "two", UID2, DRIVER, NODE, ["gpu-0"]))
    first = node.kubelet.prepare(node.kubelet.claim("default", UID1, "one"), node.kubelet.claim("team", UID2, "two"))
    ids1, error1 = _prepared(first, UID1)
    ids2, error2 = _prepared(first, UID2)
    assert (error1, error2) == ("", "")
    assert ids1 == [f"{DRIVER}/claim={UID1}-gpu-1"] and ids2 == [f"{DRIVER}/claim={UID2}-gpu-0"]
    assert node.spec_files() == [f"ponytail-dra_{UID1}.json", f"ponytail-dra_{UID2}.json"]
    spec = json.loads((node.cdi / f"ponytail-dra_{UID1}.json").read_text())
    [device] = spec["devices"]
    assert [n["path"] for n in device["containerEdits"]["deviceNodes"]] == ["/dev/nvidia0"]  # gpu-1 is minor 0
    assert spec["containerEdits"]["hooks"][0]["args"][1] == "cdi-hook"
    again = node.kubelet.prepare(node.kubelet.claim("default", UID1, "one"))
    assert _prepared(again, UID1) == (ids1, "")
    checkpoint = json.loads((node.state / "checkpoint.json").read_text())
    assert checkpoint["claims"][UID1]["state"] == "prepared"
    node.kubelet.unprepare(node.kubelet.claim("default", UID1, "one"))
    assert node.spec_files() == [f"ponytail-dra_{UID2}.json"]
    assert UID1 not in json.loads((node.state / "checkpoint.json").read_text())["claims"]
    node.kubelet.unprepare(node.kubelet.claim("default", UID1, "one"))  # twice: still fine


def test_a_prepared_claim_survives_a_plugin_restart(node: DraNode) -> None:
    node.start()
    node.api.add_claim(allocated_claim("default", "one", UID1, DRIVER, NODE, ["gpu-0"]))
    ids, error = _prepared(node.kubelet.prepare(node.kubelet.claim("default", UID1, "one")), UID1)
    assert error == ""
    node.kill()
    del node.api.claims[("default", "one")]  # answered from the checkpoint, not the API server
    node.start()
    assert _prepared(node.kubelet.prepare(node.kubelet.claim("default", UID1, "one")), UID1) == (ids, "")


@pytest.mark.parametrize("config, devices, expected", [
    ({"driverTree": "nightly"}, ["gpu-0"], "'nightly' is not a registered driver tree"),
    ({"driverTree": "/opt/evil"}, ["gpu-0"], "a path, not a registered driver name"),
    ({"require": "cuda>=99.0"}, ["gpu-0"], "cuda>=99.0"),
    ({"capabilities": "compute,warp"}, ["gpu-0"], "warp"),
    ({"colour": "red"}, ["gpu-0"], "unknown field(s) colour"),
    ({"driverTree": 5}, ["gpu-0"], "driverTree must be a string"),
    (None, ["gpu-7"], "device gpu-7 is not among this node's devices"),
])
def test_a_claim_that_cannot_work_fails_with_one_line_and_leaves_nothing(node: DraNode, config: dict | None, devices: list[str],
                                                                         expected: str) -> None:
    node.start()
    node.api.add_claim(allocated_claim("default", "bad", UID1, DRIVER, NODE, devices, config))
    ids, error = _prepared(node.kubelet.prepare(node.kubelet.claim("default", UID1, "bad")), UID1)
    assert ids == [] and expected in error and "\n" not in error and error.startswith("claim default/bad: ") or "ResourceClaim" in error, error
    assert node.spec_files() == []
    checkpoint = node.state / "checkpoint.json"
    assert not checkpoint.exists() or json.loads(checkpoint.read_text())["claims"] == {}


def test_a_claim_of_another_node_or_a_replaced_claim_is_refused(node: DraNode) -> None:
    node.start()
    node.api.add_claim(allocated_claim("default", "elsewhere", UID1, DRIVER, "node-2", ["gpu-0"]))
    node.api.add_claim(allocated_claim("default", "renewed", "0f0e0d0c-0000-4000-8000-00000000ffff", DRIVER, NODE, ["gpu-0"]))
    response = node.kubelet.prepare(node.kubelet.claim("default", UID1, "elsewhere"), node.kubelet.claim("default", UID2, "renewed"))
    assert "no device of driver gpu.ponytail.example.com in pool node-1" in _prepared(response, UID1)[1]
    assert "it was deleted and made again" in _prepared(response, UID2)[1]
    assert node.spec_files() == []


def test_a_claim_on_a_gpu_that_vanished_fails_clearly(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "host", gpu_list=gpus(2))
    node = DraNode(host, tmp_path, extra=("--resync", "3600"))
    try:
        node.start()
        node.api.add_claim(allocated_claim("default", "gone", UID1, DRIVER, NODE, ["gpu-1"]))
        lost = host.gpu_list[1]
        import shutil

        shutil.rmtree(host.proc / "driver/nvidia/gpus" / lost.bus_id)  # the driver no longer has it...
        shutil.rmtree(host.sys / "bus/pci/devices" / lost.bus_id)  # ...nor the bus
        ids, error = _prepared(node.kubelet.prepare(node.kubelet.claim("default", UID1, "gone")), UID1)
    finally:
        node.close()
    assert ids == [] and f"GPU {lost.uuid} (gpu-1) is no longer on this node" in error, error
    assert node.spec_files() == []


def test_a_plugin_killed_mid_prepare_cleans_up_at_its_next_start(node: DraNode) -> None:
    """A kill between the checkpoint's 'preparing' and 'prepared' leaves the entry and maybe the spec:
    the next start removes both, and the kubelet's next prepare makes them again."""
    node.state.mkdir()
    node.cdi.mkdir()
    (node.state / "checkpoint.json").write_text(json.dumps(
        {"version": 1, "driver": DRIVER, "claims": {UID1: {"state": "preparing", "namespace": "default", "name": "one"}}}))
    (node.state / "checkpoint.json").chmod(0o600)  # as the plugin writes it: a checkpoint others may read is refused
    (node.cdi / f"ponytail-dra_{UID1}.json").write_text("half: written\n")
    node.start()
    assert "was being prepared when the plugin stopped" in node.log()
    assert node.spec_files() == []
    node.api.add_claim(allocated_claim("default", "one", UID1, DRIVER, NODE, ["gpu-0"]))
    ids, error = _prepared(node.kubelet.prepare(node.kubelet.claim("default", UID1, "one")), UID1)
    assert error == "" and node.spec_files() == [f"ponytail-dra_{UID1}.json"]


def test_an_xid_turns_the_gpu_unhealthy_taints_its_device_and_names_the_process(node: DraNode) -> None:
    node.start()
    stream = node.kubelet.health()
    first = next(stream)
    assert {(d.device.device_name, d.health) for d in first.devices} == {("gpu-0", 1), ("gpu-1", 1)}
    bus = node.host.gpu_list[1].bus_id[:-2]  # 0000:28:00, as the driver writes it
    with open(node.kmsg, "a") as kmsg:
        kmsg.write(f"3,1201,99887766,-;NVRM: Xid (PCI:{bus}): 13, pid=4242, name=python3, Graphics Exception\n")
        kmsg.write(f"3,1202,99887767,-;NVRM: Xid (PCI:{bus}): 79, pid=4242, name=python3, GPU has fallen off the bus.\n")
    update = next(stream)
    health = {d.device.device_name: (d.health, d.message) for d in update.devices}
    assert health["gpu-0"] == (1, "") and health["gpu-1"][0] == 2 and "Xid 79" in health["gpu-1"][1], health
    stream.cancel()
    log = node.wait_log("-> NoExecute")
    assert "Xid 13 on gpu-1" in log and "reported only" in log and "pid 4242 (python3)" in log
    node.wait_log("1 tainted")
    devices = {d["name"]: d for d in node.slice()["spec"]["devices"]}
    assert devices["gpu-1"]["taints"][0]["key"] == f"{DRIVER}/xid" and devices["gpu-1"]["taints"][0]["effect"] == "NoExecute"
    assert devices["gpu-1"]["taints"][0]["value"] == "79" and "taints" not in devices["gpu-0"]
    assert node.slice()["spec"]["pool"]["generation"] == 2 and node.api.refused == []


def test_nvidia_mode_refuses_to_start_beside_a_live_plugin_of_that_name(tmp_path: Path) -> None:
    import socket

    host = FakeHost(tmp_path / "host", gpu_list=gpus(1))
    node = DraNode(host, tmp_path, extra=("--nvidia",))
    node.registry.mkdir()
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(str(node.registry / "gpu.nvidia.com-reg.sock"))
    other.listen(1)
    try:
        node.start(register=False)
        assert node.process is not None and node.process.wait(timeout=30) == 2
        node.process = None
    finally:
        other.close()
        node.close()
    assert "NVIDIA's DRA kubelet plugin already serves driver gpu.nvidia.com on this node" in node.log()
    assert node.api.slices == {}


def test_sigterm_removes_the_sockets(node: DraNode) -> None:
    node.start()
    assert node.stop() == 0
    assert list(node.registry.iterdir()) == [] and not (node.plugins / "dra.sock").exists()


@pytest.mark.parametrize("how", ["driver event", "resync"])
def test_the_slice_follows_the_probe_when_a_gpu_is_lost(tmp_path: Path, how: str) -> None:
    """The driver lets go of a GPU: its information file, its PCI function and its node go. The plugin probes
    again on the node's removal in /dev (the guard's event source), or at its next resync."""
    import shutil

    host = FakeHost(tmp_path / "host", gpu_list=gpus(2))
    node = DraNode(host, tmp_path, extra=("--resync", "3600" if how == "driver event" else "1"))
    try:
        node.start()
        assert [d["name"] for d in node.slice()["spec"]["devices"]] == ["gpu-0", "gpu-1"]
        lost = host.gpu_list[1]
        shutil.rmtree(host.proc / "driver/nvidia/gpus" / lost.bus_id)
        shutil.rmtree(host.sys / "bus/pci/devices" / lost.bus_id)
        if how == "driver event":
            (host.dev / f"nvidia{lost.minor}").unlink()
        log = node.wait_log("1 device(s), 0 tainted")
        published = node.slice()
    finally:
        node.close()
    assert [d["name"] for d in published["spec"]["devices"]] == ["gpu-0"] and published["spec"]["pool"]["generation"] == 2
    assert node.api.refused == [] and (f"remove dev nvidia{lost.minor}" in log) == (how == "driver event"), log


def test_a_mig_device_is_published_and_prepared_with_its_access_nodes(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "host", gpu_list=gpus(2), mig={1: [(1, 0), (2, 0)]})
    node = DraNode(host, tmp_path)
    try:
        node.start()
        names = [d["name"] for d in node.slice()["spec"]["devices"]]
        node.api.add_claim(allocated_claim("default", "mig", UID1, DRIVER, NODE, ["gpu-1-mig-2-0"]))
        ids, error = _prepared(node.kubelet.prepare(node.kubelet.claim("default", UID1, "mig")), UID1)
        spec = json.loads((node.cdi / f"ponytail-dra_{UID1}.json").read_text())
    finally:
        node.close()
    assert names == ["gpu-0", "gpu-1-mig-1-0", "gpu-1-mig-2-0"] and node.api.refused == []
    assert error == "" and ids == [f"{DRIVER}/claim={UID1}-gpu-1-mig-2-0"]
    paths = {n["path"] for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]}
    gi_minor, ci_minor = FakeHost.mig_minors(1, 2, 0)
    assert paths == {"/dev/nvidia1", f"/dev/nvidia-caps/nvidia-cap{gi_minor}", f"/dev/nvidia-caps/nvidia-cap{ci_minor}"}, paths


@pytest.mark.parametrize("in_cgroup_namespace", [False, True])
def test_an_xids_process_is_named_by_the_container_whose_cgroup_holds_it(node: DraNode, in_cgroup_namespace: bool) -> None:
    """The Xid's pid is a process inside a container (not its first process): the container is the one
    whose recorded devices cgroup holds that pid, read from the records the hooks write for the guard. A
    CDI hook in the container's cgroup namespace may have recorded "/": its first process's cgroup then."""
    import os
    import subprocess

    from ponytail.apply.containerrecord import record_container
    from ponytail.config import config_path, load_config

    cgroup = Path(f"/sys/fs/cgroup/devices/dra-test-{os.getpid()}")
    cgroup.mkdir()
    first = subprocess.Popen(["sleep", "60"])
    worker = subprocess.Popen(["sleep", "60"])
    try:
        for process in (first, worker):
            (cgroup / "cgroup.procs").write_text(str(process.pid))
        records = load_config(*config_path(str(node.config))).records_dir
        path = Path(record_container(records, "ctr-train", first.pid, "hook", [("c", 195, 0, "/dev/nvidia0")], "550.54.15"))
        if in_cgroup_namespace:
            written = json.loads(path.read_text())
            path.write_text(json.dumps(dict(written, cgroup={"v1": "/", "v2": "/"})))
        node.start()
        bus = node.host.gpu_list[0].bus_id[:-2]
        with open(node.kmsg, "a") as kmsg:
            kmsg.write(f"3,1,2,-;NVRM: Xid (PCI:{bus}): 31, pid={worker.pid}, name=sleep, Ch 00000008, intr 00000000. MMU Fault\n")
        log = node.wait_log("reported only")
        guard = subprocess.run([*PONYTAIL, "guard", "--config", str(node.config), "--once", "--json", "--report-only"],
                               capture_output=True, text=True, timeout=60)
        text = subprocess.run([*PONYTAIL, "guard", "--config", str(node.config), "--once", "--report-only"],
                              capture_output=True, text=True, timeout=60).stdout
    finally:
        for process in (first, worker):
            process.kill()
            process.wait()
        cgroup.rmdir()
    assert f"Xid 31 on gpu-0 ({node.host.gpu_list[0].uuid}), pid {worker.pid} (sleep) in container ctr-train" in log, log
    # the guard shows the Xid with the container it was attributed to
    container = next(c for c in json.loads(guard.stdout)["containers"] if c["id"] == "ctr-train")
    assert [(x["xid"], x["gpu"], x["pid"], x["process"]) for x in container["xids"]] == [(31, node.host.gpu_list[0].uuid, worker.pid, "sleep")], guard.stdout + log
    assert f"1 Xid(s) attributed, the last Xid 31 on {node.host.gpu_list[0].uuid}" in text, text


def test_an_xid_noted_for_an_earlier_container_of_the_same_id_is_not_shown(tmp_path: Path) -> None:
    """The note names the record's process: a container restarted under the same id starts without Xids,
    and a note that is not root's private file is not believed."""
    import os

    from ponytail.apply.containerrecord import note_xid, open_records_dir, read_xids, record_container

    records = str(tmp_path / "records")
    record_container(records, "ctr", os.getpid(), "hook", [], "550.54.15")
    record = json.loads((tmp_path / "records" / "ctr.json").read_text())
    note_xid(records, record, {"xid": 79, "gpu": "GPU-1"})
    note_xid(records, record, {"xid": 13, "gpu": "GPU-1"})
    dir_fd = open_records_dir(records)
    try:
        assert [x["xid"] for x in read_xids(dir_fd, record)] == [79, 13]
        assert read_xids(dir_fd, dict(record, pid_start=record["pid_start"] + 1)) == []  # the same id, another process
        os.chmod(tmp_path / "records" / "ctr.xids", 0o644)
        from ponytail.fs.trust import Untrusted

        with pytest.raises(Untrusted):
            read_xids(dir_fd, record)
    finally:
        os.close(dir_fd)


def test_a_plugin_killed_while_it_prepares_leaves_nothing_and_the_next_prepare_works(node: DraNode) -> None:
    """SIGKILL while the plugin waits for the claim from the API server: nothing is written yet; the
    restarted plugin prepares the claim when the kubelet asks again."""
    import threading

    node.start()
    node.api.add_claim(allocated_claim("default", "one", UID1, DRIVER, NODE, ["gpu-0"]))
    node.api.claim_delay = 5.0
    failed: list[object] = []

    def ask() -> None:
        try:
            node.kubelet.prepare(node.kubelet.claim("default", UID1, "one"))
        except Exception as e:  # noqa: BLE001 - the call dies with the plugin
            failed.append(e)

    caller = threading.Thread(target=ask)
    caller.start()
    assert node.api.claim_reads.wait(30)
    node.kill()
    caller.join(30)
    assert failed and node.spec_files() == []
    node.api.claim_delay = 0.0
    node.start()
    ids, error = _prepared(node.kubelet.prepare(node.kubelet.claim("default", UID1, "one")), UID1)
    assert error == "" and node.spec_files() == [f"ponytail-dra_{UID1}.json"]


def test_nvidia_mode_serves_nvidias_driver_name_and_device_classes(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "host", gpu_list=gpus(1))
    node = DraNode(host, tmp_path, extra=("--nvidia",))
    try:
        node.start()
        published = node.slice()
        node.api.add_claim(allocated_claim("default", "one", UID1, "gpu.nvidia.com", NODE, ["gpu-0"]))
        ids, error = _prepared(node.kubelet.prepare(node.kubelet.claim("default", UID1, "one")), UID1)
    finally:
        node.close()
    assert node.kubelet.info.name == "gpu.nvidia.com" and published["spec"]["driver"] == "gpu.nvidia.com"
    assert published["spec"]["devices"][0]["attributes"]["type"] == {"string": "gpu"}  # what NVIDIA's DeviceClass gpu.nvidia.com selects
    assert error == "" and ids == [f"gpu.nvidia.com/claim={UID1}-gpu-0"] and node.api.refused == []


def test_a_checkpoint_others_could_have_written_is_refused_with_one_line(node) -> None:
    """The checkpoint decides which specs the plugin removes: one group or others may write is not believed."""
    node.state.mkdir()
    node.cdi.mkdir()
    (node.state / "checkpoint.json").write_text(json.dumps({"version": 1, "driver": DRIVER, "claims": {}}))
    (node.state / "checkpoint.json").chmod(0o666)
    with pytest.raises(AssertionError, match="may read or write it"):
        node.start()
