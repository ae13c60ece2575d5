"""containerd 2.1 (Debian sid's, `make test-engines`) after `ponytail migrate --from nvidia`: NVIDIA's drop-in (nvidia-ctk 1.20's
/etc/containerd/conf.d/99-nvidia.toml, imported by config.toml) now runs ponytail-runtime under the handler
name `nvidia`, and ponytail's CDI spec took the place of NVIDIA's: a pod through the handler `nvidia` gets the
device plugin's GPU, and a CDI request (the CRI CDIDevices field) resolves from ponytail's spec alone."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import tomlkit
from test_engine_containerd import CUDACHECK_GPU1, DEVICES, EXPECTED_GPU1

from support.containerd_cri import make_state_dir, node_daemon, private_config
from support.engines import CUDACHECK_GPU0, EXPECTED_GPU0
from support.nvidia_toolkit import migrated_gpu_node
from support.sidroot import sid_binary

pytestmark = pytest.mark.current_engines


def test_containerd_2_1_runs_the_migrated_handler_and_ponytails_spec(tmp_path: Path) -> None:
    containerd = sid_binary("containerd")
    host, ponytail_config, rootfs, image, root = migrated_gpu_node(tmp_path)
    state = make_state_dir()
    default = subprocess.run([containerd, "config", "default"], capture_output=True, text=True, check=True).stdout
    document = tomlkit.parse(private_config(default, state, image))
    document["imports"] = [f"{root}/etc/containerd/conf.d/*.toml"]  # as nvidia-ctk's config.toml imports its drop-in dir
    config = state / "config.toml"
    config.write_text(tomlkit.dumps(document))
    (state / "cdi").mkdir()
    shutil.copy(root / "etc/cdi/nvidia.yaml", state / "cdi/nvidia.yaml")  # the engines' CDI directory after the migration
    with node_daemon(config, state, {"PONYTAIL_CONFIG": str(ponytail_config)}, rootfs, image, tmp_path, sid=True) as (daemon, pods):
        _, code, lines = pods.run(CUDACHECK_GPU1, env={"NVIDIA_VISIBLE_DEVICES": DEVICES}, mounts=[("/dev/null", f"{DEVICES}/1")],
                                  runtime_handler="nvidia")
        assert code == 0 and lines == EXPECTED_GPU1, (lines, host.log.read_text()[-2000:])
        _, code, lines = pods.run(CUDACHECK_GPU0, cdi_devices=["nvidia.com/gpu=0"])
        assert code == 0 and lines == EXPECTED_GPU0, lines
