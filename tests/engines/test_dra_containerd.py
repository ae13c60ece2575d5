"""The CDI names ``ponytail dra-plugin`` returns for a claim, as the kubelet passes them: CRI CDIDevices to
containerd 2.1 (Debian sid's, support.sidroot; `make test-engines`), which resolves them from the claim's
spec in its CDI directory, written while it runs. The container has exactly the claimed GPU and the
libcuda of the claim's driver tree; after unprepare the names resolve no more."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from support.cri_nodes import cri_node
from support.dra import DRIVER, NODE, DraNode
from support.fakehost import FakeHost
from support.kube_api import allocated_claim

pytestmark = pytest.mark.current_engines

UID_A = "aaaaaaaa-0000-4000-8000-0000000000a1"
UID_B = "bbbbbbbb-0000-4000-8000-0000000000b1"
NODES = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm"]
TREE_CUDA = 12060


def _with_tree(host: FakeHost, cdi: Path, ponytail_config: Path) -> None:
    tree = host.add_driver_tree("nightly", "560.28.03", TREE_CUDA)
    with ponytail_config.open("a") as f:
        f.write(f'[drivers.nightly]\nroot = "{tree}"\nkernel_modules = ["550.54.15"]\n')


def test_a_claims_cdi_devices_through_cri_give_exactly_its_gpu_and_its_driver_tree(tmp_path: Path) -> None:
    with cri_node("containerd 2.1", tmp_path / "node", _with_tree) as node:
        (tmp_path / "dra").mkdir()
        dra = DraNode(node.host, tmp_path / "dra", config=node.ponytail_config)
        dra.cdi = node.cdi  # containerd's CDI directory, as /var/run/cdi is on a node
        try:
            assert node.pods.version().startswith("containerd 2.1."), node.pods.version()
            dra.start()
            # gpus(3, minors=[2, 0, 1]): gpu-1 is /dev/nvidia0, gpu-0 is /dev/nvidia2
            dra.api.add_claim(allocated_claim("default", "a", UID_A, DRIVER, NODE, ["gpu-1"], {"driverTree": "nightly"}))
            dra.api.add_claim(allocated_claim("default", "b", UID_B, DRIVER, NODE, ["gpu-0"]))
            response = dra.kubelet.prepare(dra.kubelet.claim("default", UID_A, "a"), dra.kubelet.claim("default", UID_B, "b"))
            ids = {uid: tuple(i for d in response.claims[uid].devices for i in d.cdi_device_ids) for uid in (UID_A, UID_B)}
            assert all(ids.values()), (response, dra.log())
            outputs = {}
            for uid in (UID_A, UID_B):
                _, code, lines = node.pods.run(["/usr/local/bin/cudacheck", *NODES], cdi_devices=ids[uid])
                assert code == 0, (lines, node.daemon.log()[-2000:])
                outputs[uid] = lines
            dra.kubelet.unprepare(dra.kubelet.claim("default", UID_A, "a"))
            with pytest.raises(grpc.RpcError, match="unresolvable CDI devices"):
                node.pods.run(["/usr/local/bin/cudacheck", *NODES], cdi_devices=ids[UID_A])
        finally:
            dra.close()
    expected = {UID_A: ("/dev/nvidia0", TREE_CUDA), UID_B: ("/dev/nvidia2", 12040)}
    for uid, (gpu, cuda) in expected.items():
        assert outputs[uid][0] == f"cuDriverGetVersion {cuda}", outputs[uid]
        opened = {line.split()[1]: line.split()[2] for line in outputs[uid] if line.startswith("open ")}
        assert opened == {n: "ENXIO" if n in (gpu, "/dev/nvidiactl", "/dev/nvidia-uvm") else "ENOENT" for n in NODES}, outputs[uid]
