"""A Kubernetes node's engine for the CDI tests: a private containerd 2.1 (Debian sid's, in the sid root of
support.sidroot, `make test-engines`) on the node files of support.containerd_cri.gpu_node_files (a 3-GPU fake
host, ponytail's strict config, an image), with ponytail's runtime handler ``ponytail`` configured beside the
default runc, and the CDI specs a test writes into the engine's own CDI directory before the engine starts;
pods through the project's CRI client. CRI-O is in no package registry this project reaches: no CRI-O node."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from support.containerd_cri import (
    Containerd,
    Pods,
    configured_private_config,
    gpu_node_files,
    make_state_dir,
    node_daemon,
    remove_state_dir,
)
from support.fakehost import FakeHost
from support.sidroot import sid_binary

ENGINES = ("containerd 2.1",)
HANDLERS = ("", "ponytail")  # the engine's default runc, and ponytail-runtime


@dataclass
class CriNode:
    pods: Pods
    host: FakeHost
    cdi: Path  # the engine's CDI spec directory
    ponytail_config: Path
    daemon: Containerd


@contextmanager
def cri_node(engine: str, base: Path, write_specs: Callable[[FakeHost, Path, Path], None],
             env: dict[str, str] | None = None) -> Iterator[CriNode]:
    """``engine`` (one of ENGINES) running, after ``write_specs(host, cdi_dir, ponytail_config)``; ``env``
    reaches containerd and the runtimes and hooks it starts. Skips, saying why, where Debian's archive
    cannot be reached."""
    assert engine in ENGINES, engine
    containerd = sid_binary("containerd")
    host, ponytail_config, rootfs, image = gpu_node_files(base)
    state = make_state_dir()
    try:
        config, _ = configured_private_config(containerd, state, image)
        (state / "cdi").mkdir()
        write_specs(host, state / "cdi", ponytail_config)
    except BaseException:  # a failed or skipped spec: node_daemon, which removes the state, is not reached
        remove_state_dir(state)
        raise
    with node_daemon(config, state, env or {}, rootfs, image, base, sid=True) as (daemon, pods):
        yield CriNode(pods, host, state / "cdi", ponytail_config, daemon)
