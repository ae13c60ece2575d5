"""The CDI names ``ponytail dra-plugin`` returns for a claim, started by a real engine: podman 4.3
(Debian 12's), which reads CDI specs from /run/cdi (each run gets a private one: support.cdi_support).
The container has exactly the claimed GPU, and the libcuda of the claim's driver tree loads; two
claims share nothing; the hostile-image suite under a claim's spec never reaches the host."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from security.test_hostile_images import CASES, WORKS, Case
from support.cdi_support import CdiPodman
from support.dra import DRIVER, NODE, DraNode
from support.fakehost import FakeHost, gpus, make_rootfs
from support.harness import tree_digest
from support.hostile import CUDA_OK, Stage

HOST_SHAPE = {"gpu_list": gpus(3, minors=[2, 0, 1])}  # index 0 is /dev/nvidia2
NODES = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm"]
CHECK = ["sh", "-c", f"/usr/local/bin/cudacheck {' '.join(NODES)}"]
TREE_CUDA = 12060
UID_A = "aaaaaaaa-0000-4000-8000-00000000000a"
UID_B = "bbbbbbbb-0000-4000-8000-00000000000b"


@pytest.fixture(scope="module")
def prepared(shared_host: FakeHost, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DraNode, dict[str, list[str]]]]:
    """Claim A: GPU index 1 (/dev/nvidia0) with driver tree 'nightly' (CUDA 12.6); claim B: GPU index 0
    (/dev/nvidia2) with the host's driver; both prepared by the plugin through the stand-in kubelet."""
    from support.kube_api import allocated_claim

    base = tmp_path_factory.mktemp("dra")
    tree = shared_host.add_driver_tree("nightly", "560.28.03", TREE_CUDA)
    config = base / "config.toml"
    config.write_text(shared_host.config_text() + f'[drivers.nightly]\nroot = "{tree}"\nkernel_modules = ["550.54.15"]\n')
    node = DraNode(shared_host, base, config=config)
    node.start()
    node.api.add_claim(allocated_claim("default", "a", UID_A, DRIVER, NODE, ["gpu-1"], {"driverTree": "nightly"}))
    node.api.add_claim(allocated_claim("default", "b", UID_B, DRIVER, NODE, ["gpu-0"]))
    response = node.kubelet.prepare(node.kubelet.claim("default", UID_A, "a"), node.kubelet.claim("default", UID_B, "b"))
    ids = {uid: [i for d in response.claims[uid].devices for i in d.cdi_device_ids] for uid in (UID_A, UID_B)}
    assert all(ids.values()) and not any(response.claims[u].error for u in ids), (response, node.log())
    node.stop()  # the specs stay: they are the claims', until unprepare
    assert "driverTrees" in str(node.slice())
    yield node, ids
    node.close()


def _engine(node: DraNode, base: Path) -> CdiPodman:
    (base / "hooks.d").mkdir(exist_ok=True)
    specs = [node.cdi / name for name in node.spec_files()]
    return CdiPodman(specs[0], base / "hooks.d", extra_specs=specs[1:])


def _opened(out: str) -> dict[str, str]:
    return {line.split()[1]: line.split()[2] for line in out.splitlines() if line.startswith("open ")}


@pytest.mark.parametrize("uid, gpu_node, cuda", [(UID_A, "/dev/nvidia0", TREE_CUDA), (UID_B, "/dev/nvidia2", 12040)])
def test_a_claims_cdi_names_give_exactly_its_gpu_and_its_driver_trees_libcuda(prepared: tuple, tmp_path: Path, uid: str, gpu_node: str,
                                                                               cuda: int) -> None:
    node, ids = prepared
    engine = _engine(node, tmp_path)
    try:
        result = engine.run(make_rootfs(tmp_path / "rootfs"), CHECK, devices=ids[uid])
    finally:
        engine.close()
    assert result.returncode == 0, result.stderr
    assert f"cuDriverGetVersion {cuda}" in result.stdout, result.stdout
    expected = {n: "ENXIO" if n in (gpu_node, "/dev/nvidiactl", "/dev/nvidia-uvm") else "ENOENT" for n in NODES}
    assert _opened(result.stdout) == expected, result.stdout


def test_two_claims_share_nothing(prepared: tuple) -> None:
    """Each claim's spec names only its own GPU's node, and the two specs' device names differ."""
    import json

    node, ids = prepared
    specs = {uid: json.loads((node.cdi / f"ponytail-dra_{uid}.json").read_text()) for uid in ids}
    nodes = {uid: {n["path"] for d in s["devices"] for n in d["containerEdits"]["deviceNodes"]} for uid, s in specs.items()}
    assert nodes == {UID_A: {"/dev/nvidia0"}, UID_B: {"/dev/nvidia2"}}
    names = {uid: {d["name"] for d in s["devices"]} for uid, s in specs.items()}
    assert not names[UID_A] & names[UID_B]
    tree_mounts = [m["hostPath"] for m in specs[UID_A]["containerEdits"]["mounts"] if "libcuda.so." in m["hostPath"]]
    host_mounts = [m["hostPath"] for m in specs[UID_B]["containerEdits"]["mounts"] if "libcuda.so." in m["hostPath"]]
    assert tree_mounts and all("/umd/nightly/" in p for p in tree_mounts) and not any("/umd/" in p for p in host_mounts)


@pytest.fixture
def stage(tmp_path: Path, shared_host: FakeHost, request: pytest.FixtureRequest) -> Iterator[Stage]:
    s = Stage(tmp_path, shared_host, container_id=f"dra-{request.node.name}"[:60])
    yield s
    s.close()


RUNC_WRITES_THROUGH = {"dev-absolute", "dev-relative"}  # runc's own writes through an image's /dev link (test_cdi_podman.py)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_image_under_a_claims_spec_never_reaches_the_host(prepared: tuple, stage: Stage, case: Case, tmp_path: Path) -> None:
    node, ids = prepared
    case.build(stage)
    engine = _engine(node, tmp_path)
    try:
        if case.name in RUNC_WRITES_THROUGH:
            plain = engine.run(stage.rootfs, ["/bin/true"])
            assert plain.returncode == 0, plain.stderr
            stage.victim_digest = tree_digest(stage.victim)
        result = engine.run(stage.rootfs, ["/usr/local/bin/cudacheck", "/dev/nvidia2", "/dev/nvidiactl"], devices=ids[UID_B])
    finally:
        engine.close()
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr
    stage.assert_host_untouched()
    if result.returncode == 0 and case.expect == WORKS:
        assert CUDA_OK in result.stdout and "open /dev/nvidia2 ENXIO" in result.stdout, result.stdout
