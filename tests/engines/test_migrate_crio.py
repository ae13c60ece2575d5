"""CRI-O 1.36 after `ponytail migrate --from nvidia`: NVIDIA's drop-in (nvidia-ctk 1.20's
crio.conf.d/99-nvidia.toml) now runs ponytail-runtime under the handler `nvidia`, and ponytail's CDI spec took
the place of NVIDIA's: a pod through `nvidia` gets the device plugin's GPU, a CDI request resolves from ponytail's spec."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_engine_containerd import CUDACHECK_GPU1, DEVICES, EXPECTED_GPU1
from test_engine_crio import engines

from support.containerd_cri import Pods, make_state_dir, oci_archive, remove_state_dir
from support.crio import Crio
from support.engines import CUDACHECK_GPU0, EXPECTED_GPU0
from support.nvidia_toolkit import migrated_gpu_node

pytestmark = pytest.mark.current_engines


def test_crio_runs_the_migrated_handler_and_ponytails_spec(tmp_path: Path) -> None:
    engines_dir = engines()
    _, ponytail_config, rootfs, image, root = migrated_gpu_node(tmp_path)
    state = make_state_dir()
    crio = Crio(state, engines_dir, pause_image=image)
    pods = None
    try:
        crio.load_image(oci_archive(rootfs, image, ["/bin/sleep", "100000"], tmp_path / "image.tar"))
        shutil.copy(root / "etc/crio/crio.conf.d/99-nvidia.toml", crio.drop_ins / "99-nvidia.toml")
        shutil.copy(root / "etc/cdi/ponytail.yaml", state / "cdi/ponytail.yaml")
        crio.start(ponytail_config.read_text())
        pods = Pods(crio, image, tmp_path / "stubs")  # type: ignore[arg-type]  # the same CRI as containerd's
        _, code, lines = pods.run(CUDACHECK_GPU1, env={"NVIDIA_VISIBLE_DEVICES": DEVICES}, mounts=[("/dev/null", f"{DEVICES}/1")],
                                  runtime_handler="nvidia")
        assert code == 0 and lines == EXPECTED_GPU1, (lines, crio.log()[-2000:])
        _, code, lines = pods.run(CUDACHECK_GPU0, cdi_devices=["nvidia.com/gpu=0"])
        assert code == 0 and lines == EXPECTED_GPU0, lines
    finally:
        if pods is not None:
            pods.close()
        crio.stop()
        remove_state_dir(state)
