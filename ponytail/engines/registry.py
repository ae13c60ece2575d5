"""The container engines ponytail registers with: one record per engine.

``ponytail configure`` edits an engine's config with its record (the default file, the edit,
what to restart), ``ponytail check`` decides with it whether the engine is in use (its program,
its directory, its sockets) and asks it what its configuration registers, and the command line
offers exactly these names. An engine not named here is an error, never another engine's edit.

A new engine is a record here and a module in ``engines/`` (named in ``_module`` below, by import,
so that PyInstaller sees it) with its ``edit``, ``registered(root)`` (what ``edit`` wrote, read
back) and ``unregistered(root)`` (what the doctor says when there is nothing);
``tests/unit/test_engine_registry.py`` fails until they are there. The modules are imported when
an engine is used, not with this table: the command line reads the names without their parsers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from ponytail.engines.model import Registered, Unregistered
from ponytail.errors import UsageError


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
    drop_ins: bool = False  # configure may put its entry in a drop-in the config imports (--drop-in-config)
    backend_of: str | None = None  # in use only where a kubelet is configured, when this engine runs too

    def module(self) -> ModuleType:
        """The engine's module: ``edit(path, text, settings, remove, added)``, ``registered(root)``..."""
        return _module(self.name)

    def registered(self, root: str) -> Registered | None:
        """What the engine's configuration under ``root`` registers of ponytail, as ``edit`` wrote it."""
        found: Registered | None = self.module().registered(root)
        return found

    def unregistered(self, root: str) -> Unregistered:
        """Where the engine's configuration under ``root`` was read, for a finding when nothing is registered."""
        missing: Unregistered = self.module().unregistered(root)
        return missing

    def edited_file(self, path: str, read: Callable[[str], str | None]) -> str:
        """The file ``edit`` changes for the engine config ``path`` (``read`` reads a file): itself, or
        (CRI-O) a drop-in beside it, the config read and checked."""
        chosen = getattr(self.module(), "edited_file", None)
        return path if chosen is None else str(chosen(path, read(path)))


ENGINES: tuple[Engine, ...] = (
    Engine(
        "docker", "docker", "dockerd", "/etc/docker", "/etc/docker/daemon.json",
        "systemctl restart docker   (or: kill -HUP $(pidof dockerd) to reload runtimes only)",
        ("/run/docker.sock", "/var/run/docker.sock"), "ponytail-runtime",
    ),
    Engine(
        "containerd", "containerd", "containerd", "/etc/containerd", "/etc/containerd/config.toml",
        "systemctl restart containerd", ("/run/containerd/containerd.sock",), "ponytail-runtime",
        drop_ins=True, backend_of="docker",  # Debian's docker.io runs a system containerd that serves only dockerd
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
KUBELET_CONFIGS = ("/var/lib/kubelet/config.yaml", "/etc/kubernetes/kubelet.conf")  # a node of a cluster


def engine(name: str) -> Engine:
    """The engine called ``name``; an unknown name is a UsageError naming the known ones."""
    for known in ENGINES:
        if known.name == name:
            return known
    raise UsageError(f"unknown engine {name!r}: ponytail knows {', '.join(NAMES)}")


def _module(name: str) -> ModuleType:
    from ponytail.engines import crio, docker, podman  # with their parsers: only when an engine is used
    from ponytail.engines.containerd import config as containerd

    _MODULES = {"docker": docker, "containerd": containerd, "crio": crio, "podman": podman}  # noqa: N806 - the table of the docstring
    return _MODULES[name]
