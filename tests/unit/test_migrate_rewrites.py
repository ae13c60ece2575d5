"""The migration's rewrites of the engines' files, text in and text out: each entry that runs NVIDIA's
nvidia-container-runtime runs ponytail-runtime instead, under its own name (--runtime nvidia,
RuntimeClass nvidia), and nothing else changes; the engine then reads the file as registering
ponytail (what ``ponytail check`` asks). No root, no engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from ponytail.engines import registry
from ponytail.install.migrate.nvidia import replace_runtime, runtime_values
from ponytail.install.migrate.plan import boot_unit

pytestmark = pytest.mark.unit

RUNTIME = "/usr/local/bin/ponytail-runtime"

# as nvidia-ctk runtime configure writes them
DOCKER = """{
    "default-runtime": "nvidia",
    "runtimes": {
        "nvidia": {
            "args": [],
            "path": "nvidia-container-runtime"
        }
    }
}
"""
CONTAINERD_1 = """version = 2

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  privileged_without_host_devices = false
  runtime_type = "io.containerd.runc.v2"

  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
    BinaryName = "/usr/bin/nvidia-container-runtime"
"""
CONTAINERD_2_DROP_IN = """version = 3

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"

  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia.options]
    BinaryName = "/usr/bin/nvidia-container-runtime"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia-cdi.options]
    BinaryName = '/usr/bin/nvidia-container-runtime.cdi'
"""
CRIO = """[crio]
  [crio.runtime]
    default_runtime = "nvidia"
    [crio.runtime.runtimes.nvidia]
      runtime_path = "/usr/bin/nvidia-container-runtime"
      runtime_type = "oci"
"""


@pytest.mark.parametrize(
    "engine, path, text, found",
    [
        ("docker", "/etc/docker/daemon.json", DOCKER, ["nvidia-container-runtime"]),
        ("containerd", "/etc/containerd/config.toml", CONTAINERD_1, ["/usr/bin/nvidia-container-runtime"]),
        ("containerd", "/etc/containerd/conf.d/99-nvidia.toml", CONTAINERD_2_DROP_IN,
         ["/usr/bin/nvidia-container-runtime", "/usr/bin/nvidia-container-runtime.cdi"]),
        ("crio", "/etc/crio/crio.conf.d/99-nvidia.toml", CRIO, ["/usr/bin/nvidia-container-runtime"]),
    ],
)
def test_nvidias_entries_run_ponytail_runtime(tmp_path: Path, engine: str, path: str, text: str, found: list[str]) -> None:
    assert runtime_values(text) == found
    new = replace_runtime(text, RUNTIME)
    expected = text
    for value in found:
        expected = expected.replace(f'"{value}"', f'"{RUNTIME}"').replace(f"'{value}'", f"'{RUNTIME}'")
    assert new == expected and runtime_values(new) == []  # only the values, their quotes kept
    assert replace_runtime(new, RUNTIME) == new
    before = registry.engine(engine)
    where = tmp_path / path.lstrip("/")
    where.parent.mkdir(parents=True)
    if path == "/etc/containerd/conf.d/99-nvidia.toml":
        (tmp_path / "etc/containerd/config.toml").write_text('version = 3\nimports = ["/etc/containerd/conf.d/*.toml"]\n')
    where.write_text(text)
    assert before.registered(str(tmp_path)) is None  # NVIDIA's runtime is not ponytail's
    where.write_text(new)
    registered = before.registered(str(tmp_path))
    assert registered is not None and registered.program == RUNTIME and registered.path == str(where), registered


def test_other_values_are_left_alone() -> None:
    text = '{"runtimes": {"crun": {"path": "/usr/bin/crun"}}, "data-root": "/srv/nvidia-container-runtime-data"}'
    assert runtime_values(text) == [] and replace_runtime(text, RUNTIME) == text


def test_the_boot_unit_writes_the_spec_before_the_engines() -> None:
    unit = boot_unit("/usr/bin/ponytail cdi generate --output /var/run/cdi/ponytail.yaml", "/var/run/cdi/ponytail.yaml").decode()
    assert "ExecStart=/usr/bin/ponytail cdi generate --output /var/run/cdi/ponytail.yaml\n" in unit
    assert "Before=containerd.service docker.service crio.service" in unit and unit.endswith("WantedBy=multi-user.target\n")
