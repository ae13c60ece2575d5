"""What of NVIDIA's container toolkit is on this node, as its packages and ``nvidia-ctk`` put it
there: plain data for the migration's plan. Reads files; changes nothing."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ponytail.fs.hostfiles import read_head
from ponytail.install.dockergpus import HOOK_NAME, SERVICE_PATH
from ponytail.install.nvidiahook import hook_paths_in

# NVIDIA's programs on the engines' PATH that a migration moves aside, and what ponytail puts in the
# place of those whose name it answers to: a link to ponytail for nvidia-container-runtime-hook (dockerd's
# --gpus looks for it), the hook script of `ponytail install-nvidia-hook` for nvidia-cdi-hook (the specs the
# device plugin and the DRA driver write name it); nvidia-ctk is only moved aside
BINARIES = ("nvidia-container-runtime-hook", "nvidia-cdi-hook", "nvidia-ctk")
SERVED = {HOOK_NAME: "link", "nvidia-cdi-hook": "script"}
# the runtime NVIDIA's engine entries run (nvidia-ctk runtime configure: docker, containerd, CRI-O)
RUNTIMES = ("nvidia-container-runtime", "nvidia-container-runtime.cdi", "nvidia-container-runtime.legacy")
CONFIG = "/etc/nvidia-container-runtime/config.toml"
PONYTAIL_VENDOR = "nvidia.com"  # the vendor of every kind ponytail's specs use
# the unit a migration writes (and its link enabling it) where ponytail's spec goes to a tmpfs (plan.py)
BOOT_UNIT = "/etc/systemd/system/ponytail-cdi-spec.service"
BOOT_WANTS = "/etc/systemd/system/multi-user.target.wants/ponytail-cdi-spec.service"
# podman's legacy hook of older toolkit packages: it runs nvidia-container-runtime-hook, ponytail's link after a migration
OCI_HOOKS = ("/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json", "/etc/containers/oci/hooks.d/oci-nvidia-hook.json")
# the engines' files that may name NVIDIA's runtime: the main configs and their drop-in directories
ENGINE_FILES = ("/etc/docker/daemon.json", "/etc/containerd/config.toml", "/etc/crio/crio.conf")
ENGINE_DROP_INS = ("/etc/containerd/conf.d", "/etc/crio/crio.conf.d")
# the units nvidia-ctk's package ships to regenerate /var/run/cdi/nvidia.yaml on driver changes
REFRESH_UNITS = ("/usr/lib/systemd/system/nvidia-cdi-refresh.path", "/etc/systemd/system/nvidia-cdi-refresh.path")
_NAMES = "|".join(re.escape(r) for r in RUNTIMES)
_RUNTIME_VALUE = re.compile(r"""(["'])((?:[^"'\n]*/)?(?:""" + _NAMES + r"""))\1""")


@dataclass(frozen=True)
class Toolkit:
    """NVIDIA's files found, by path on the node (without the root prefix)."""

    specs: tuple[str, ...]  # its CDI specs (nvidia-ctk's, by their hooks) of a kind ponytail writes (clashing: replaced)
    engine_files: tuple[str, ...]  # engine configs whose runtime entries run nvidia-container-runtime
    binaries: tuple[str, ...]  # its programs on the engines' PATH
    config: str | None  # /etc/nvidia-container-runtime/config.toml
    refresh_units: tuple[str, ...]  # nvidia-cdi-refresh units present
    oci_hooks: tuple[str, ...] = ()  # podman's legacy hooks.d file
    # specs of NVIDIA's libraries of kinds ponytail does not write (the device plugin's, the GPU
    # Operator's, the DRA driver's): (path, kind), left alone; and the hook paths they name
    kept_specs: tuple[tuple[str, str], ...] = ()
    hook_paths: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.specs or self.engine_files or self.binaries or self.config)


def clashes(kind: str) -> bool:
    """A kind ponytail's specs use (nvidia.com/gpu, nvidia.com/<feature>): two generators of one kind
    make its devices unresolvable. The device plugin's k8s.device-plugin.nvidia.com/gpu, the GPU
    Operator's management.nvidia.com/gpu and the DRA driver's kinds do not clash."""
    return kind.startswith(PONYTAIL_VENDOR + "/")


def probe(root: str) -> Toolkit:
    from ponytail.cdi.owners import NVIDIA_CTK, scan  # here: every command loads this module (cli.migrate), not this import

    nvidias = [f for f in scan(root) if f.generator == NVIDIA_CTK]
    specs = tuple(_on_node(root, f.path) for f in nvidias if clashes(f.kind))
    kept = tuple((_on_node(root, f.path), f.kind) for f in nvidias if not clashes(f.kind))
    named = tuple(dict.fromkeys(p for f in nvidias if not clashes(f.kind) and f.spec is not None for p in hook_paths_in(f.spec) if os.path.isabs(p)))
    engine_files = tuple(p for p in _engine_files(root) if runtime_values(read_head(under(root, p), 4 << 20, default="")))
    binaries = tuple(
        os.path.join(d, name) for d in dict.fromkeys(SERVICE_PATH) for name in BINARIES
        if os.path.lexists(under(root, os.path.join(d, name))) and not _same_dir_seen(root, d)
        and not _ponytails_link(under(root, os.path.join(d, name)))
    )
    config = CONFIG if os.path.lexists(under(root, CONFIG)) else None
    units = tuple(u for u in REFRESH_UNITS if os.path.lexists(under(root, u)))
    hooks = tuple(h for h in OCI_HOOKS if os.path.lexists(under(root, h)))
    return Toolkit(specs, engine_files, _unique_binaries(root, binaries), config, units, hooks, kept, named)


def runtime_values(text: str) -> list[str]:
    """The quoted values in an engine config that name NVIDIA's runtime."""
    return [m.group(2) for m in _RUNTIME_VALUE.finditer(text)]


def replace_runtime(text: str, runtime: str) -> str:
    """``text`` with every quoted value naming NVIDIA's runtime naming ``runtime`` instead (quotes kept)."""
    return _RUNTIME_VALUE.sub(lambda m: f"{m.group(1)}{runtime}{m.group(1)}", text)


def under(root: str, path: str) -> str:
    """The host path of the node's ``path``: its links resolved inside ``root`` (a node's absolute
    /var/run -> /run leads to the node's /run, not this process's)."""
    from ponytail.fs.inroot import host_path_in_root  # ctypes: not with every command (cli.migrate loads this module)

    return host_path_in_root(root, path)


def _on_node(root: str, path: str) -> str:
    return path if root == "/" else "/" + os.path.relpath(path, root)


def _engine_files(root: str) -> list[str]:
    found = list(ENGINE_FILES)
    for directory in ENGINE_DROP_INS:
        try:
            names = sorted(os.listdir(under(root, directory)))
        except OSError:
            continue
        found += [os.path.join(directory, n) for n in names if os.path.isfile(under(root, os.path.join(directory, n)))]
    return [p for p in found if os.path.isfile(under(root, p))]


def _ponytails_link(path: str) -> bool:
    """A link ponytail made (install-docker-gpus): it leads to a ponytail command, not NVIDIA's."""
    return os.path.islink(path) and os.path.basename(os.readlink(path)).startswith("ponytail")


def _same_dir_seen(root: str, directory: str) -> bool:
    """/bin and /sbin are links to /usr/bin and /usr/sbin on merged-/usr systems: one place, one step."""
    return os.path.islink(under(root, directory))


def _unique_binaries(root: str, paths: tuple[str, ...]) -> tuple[str, ...]:
    seen: set[tuple[int, int]] = set()
    out = []
    for p in paths:
        st = os.lstat(under(root, p))
        key = (st.st_dev, st.st_ino)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return tuple(out)
