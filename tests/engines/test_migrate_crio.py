"""CRI-O after `ponytail migrate --from nvidia`, read as CRI-O reads its configuration (support.crio; no package
registry this project reaches has CRI-O, so none starts): NVIDIA's drop-in (nvidia-ctk 1.20's
crio.conf.d/99-nvidia.toml) now runs ponytail-runtime under the handler `nvidia`, and ponytail's CDI spec took
the place of NVIDIA's in the CDI directory."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from support.containerd_cri import make_state_dir, remove_state_dir
from support.crio import CrioFiles
from support.engines import console_script
from support.nvidia_toolkit import migrated_gpu_node


def test_crio_reads_the_migrated_handler_and_ponytails_spec(tmp_path: Path) -> None:
    _, _, _, _, root = migrated_gpu_node(tmp_path)
    state = make_state_dir()
    try:
        crio = CrioFiles(state)
        before = crio.effective()
        shutil.copy(root / "etc/crio/crio.conf.d/99-nvidia.toml", crio.drop_ins / "99-nvidia.toml")
        runtime = crio.effective()["crio"]["runtime"]
        assert runtime["runtimes"]["nvidia"]["runtime_path"] == console_script("ponytail-runtime"), runtime["runtimes"]["nvidia"]
        assert runtime["runtimes"]["runc"] == before["crio"]["runtime"]["runtimes"]["runc"]
        specs = sorted((root / "etc/cdi").iterdir())
        assert [p.name for p in specs] == ["nvidia.yaml"]
        spec = yaml.safe_load(specs[0].read_text())
        assert spec["kind"] == "nvidia.com/gpu" and all(h["path"] == console_script("ponytail")
                                                        for h in spec.get("containerEdits", {}).get("hooks", [])), spec
    finally:
        remove_state_dir(state)
