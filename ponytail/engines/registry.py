"""The container engines ponytail registers with: one record per engine.

``ponytail configure`` edits an engine's config with its record (the default file, the edit,
what to restart), ``ponytail check`` decides with it whether the engine is in use (its program,
its directory, its sockets) and checks it, and the command line offers exactly these names. An
engine not named here is an error, never another engine's edit.

A new engine is a record here, a module in ``engines/configure/`` with its ``edit`` (named in
``_MODULES`` below, by import, so that PyInstaller sees it), and its check in ``cli/check.py``'s
``ENGINE_CHECKS``; ``tests/unit/test_engine_registry.py`` fails until all three are there.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class Engine:
    name: str  # as --runtime and --engine take it
    label: str  # as people write it
    program: str  # its daemon or command, on PATH where it is installed
    config_dir: str  # its configuration directory, there where it is installed
    config_path: str  # the file `ponytail configure` edits unless --config-file names another
    restart: str  # what makes the engine read the edit
    sockets: tuple[str, ...]  # where its API listens while its service runs (systemd's socket units too)
    runs: str  # the ponytail command the engine is given: ponytail-runtime (a runtime) or ponytail (a hooks.d hook)
    hooks_configs: tuple[str, ...] = ()  # its config files (or drop-in dirs) that may set hooks_dir

    def module(self) -> ModuleType:
        """The engine's configure module: ``edit(path, text, settings, remove, added)``."""
        return _module(self.name)


ENGINES: tuple[Engine, ...] = (
    Engine(
        "docker", "docker", "dockerd", "/etc/docker", "/etc/docker/daemon.json",
        "systemctl restart docker   (or: kill -HUP $(pidof dockerd) to reload runtimes only)",
        ("/run/docker.sock", "/var/run/docker.sock"), "ponytail-runtime",
    ),
    Engine(
        "containerd", "containerd", "containerd", "/etc/containerd", "/etc/containerd/config.toml",
        "systemctl restart containerd", ("/run/containerd/containerd.sock",), "ponytail-runtime",
    ),
    Engine(
        "crio", "CRI-O", "crio", "/etc/crio", "/etc/crio/crio.conf",  # the drop-in goes to crio.conf.d/ beside it
        "systemctl restart crio", ("/run/crio/crio.sock", "/var/run/crio/crio.sock"), "ponytail-runtime",
        hooks_configs=("/etc/crio/crio.conf", "/etc/crio/crio.conf.d"),
    ),
    Engine(
        "podman", "podman", "podman", "/etc/containers", "/usr/share/containers/oci/hooks.d/ponytail.json",  # what Debian 12's podman reads
        "nothing to restart: podman reads hooks.d at every run", ("/run/podman/podman.sock",), "ponytail",
        hooks_configs=("/etc/containers/containers.conf",),
    ),
)
NAMES: tuple[str, ...] = tuple(e.name for e in ENGINES)


def engine(name: str) -> Engine:
    """The engine called ``name``; an unknown name is a UsageError naming the known ones."""
    for known in ENGINES:
        if known.name == name:
            return known
    from ponytail.errors import UsageError

    raise UsageError(f"unknown engine {name!r}: ponytail knows {', '.join(NAMES)}")


def _module(name: str) -> ModuleType:
    from ponytail.engines import crio, docker, podman
    from ponytail.engines.containerd import config as containerd

    _MODULES = {"docker": docker, "containerd": containerd, "crio": crio, "podman": podman}  # noqa: N806 - the table of the docstring
    return _MODULES[name]
