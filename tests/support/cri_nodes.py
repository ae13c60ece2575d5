"""A Kubernetes node's engine for the CDI tests: a private containerd 2.3 or CRI-O 1.36 (from $ENGINES_DIR) on
the node files of support.containerd_cri.gpu_node_files (a 3-GPU fake host, ponytail's strict config, an
image), with ponytail's runtime handler ``ponytail`` configured beside the default runc, and the CDI specs a
test writes into the engine's own CDI directory before the engine starts."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.containerd_cri import (
    Pods,
    configured_private_config,
    gpu_node_files,
    make_state_dir,
    node_daemon,
    oci_archive,
    remove_state_dir,
)
from support.crio import CONMON, Crio
from support.engines import TIMEOUT, console_script, current_engines
from support.fakehost import FakeHost

ENGINES = ("containerd 2.3", "CRI-O 1.36")
HANDLERS = ("", "ponytail")  # the engine's default runc, and ponytail-runtime


@dataclass
class CriNode:
    pods: Pods
    host: FakeHost
    cdi: Path  # the engine's CDI spec directory
    ponytail_config: Path


@contextmanager
def cri_node(engine: str, base: Path, write_specs: Callable[[FakeHost, Path, Path], None]) -> Iterator[CriNode]:
    """``engine`` (one of ENGINES) running, after ``write_specs(host, cdi_dir, ponytail_config)``; skips
    the test without the current engines."""
    engines = current_engines()
    if engines is None:
        pytest.skip("current engines (containerd 2.3, CRI-O 1.36, crictl, runc 1.5): run make test-engines (ENGINES_DIR)")
    host, ponytail_config, rootfs, image = gpu_node_files(base)
    state = make_state_dir()
    if engine == "containerd 2.3":
        config, _ = configured_private_config(str(engines / "containerd"), state, image)
        (state / "cdi").mkdir()
        write_specs(host, state / "cdi", ponytail_config)
        with node_daemon(config, state, {}, rootfs, image, base, engines) as (_, pods):
            yield CriNode(pods, host, state / "cdi", ponytail_config)
        return
    if not (engines / "crio").is_file() or not Path(CONMON).is_file():
        pytest.skip(f"CRI-O needs {engines}/crio and {CONMON} (scripts/install-system-packages.sh installs conmon)")
    crio = Crio(state, engines, pause_image=image)
    pods = None
    try:
        configured = subprocess.run([console_script("ponytail"), "configure", "--runtime", "crio", "--config-file", str(crio.config),
                                     "--path", console_script("ponytail-runtime"), "--state-dir", str(state / "ponytail")],
                                    capture_output=True, text=True, timeout=TIMEOUT)
        assert configured.returncode == 0, configured.stderr
        crio.load_image(oci_archive(rootfs, image, ["/bin/sleep", "100000"], base / "image.tar"))
        write_specs(host, state / "cdi", ponytail_config)
        crio.start(ponytail_config.read_text())
        pods = Pods(crio, image, base / "stubs")  # type: ignore[arg-type]  # the same CRI as containerd's
        yield CriNode(pods, host, state / "cdi", ponytail_config)
    finally:
        if pods is not None:
            pods.close()
        crio.stop()
        remove_state_dir(state)
