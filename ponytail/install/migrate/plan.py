"""The migration's plan: for each path NVIDIA's toolkit has, what ponytail leaves there (plain data).

Every path the migration touches is moved aside whole (its bytes, mode, owner and times kept in the
state directory) and then holds ponytail's replacement or nothing:
  NVIDIA's CDI specs       -> of a kind ponytail writes (nvidia.com/gpu): gone, ponytail's spec beside the
                              first one, under its own name (ponytail.yaml); of another kind (the device
                              plugin's, the GPU Operator's, the DRA driver's): left alone, their hook paths
                              ponytail's hook script
  ponytail's spec in /run  -> a unit that writes it again at boot, before the engines (/var/run is a tmpfs)
  engine entries           -> the same file, its entries running ponytail-runtime instead of
                              nvidia-container-runtime (their names kept: --runtime nvidia, RuntimeClass nvidia)
  hook binaries on PATH    -> a link to ponytail where ponytail answers to the name (nvidia-container-runtime-hook),
                              ponytail's hook script for nvidia-cdi-hook (the specs other node daemons write name it),
                              else nothing
  its config               -> nothing (ponytail reads /etc/ponytail/config.toml)
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from ponytail.errors import PonytailError
from ponytail.install.dockergpus import SERVICE_PATH
from ponytail.install.files import read_text
from ponytail.install.hooklinks import holds
from ponytail.install.migrate.nvidia import BOOT_UNIT, BOOT_WANTS, SERVED, Toolkit, replace_runtime, under
from ponytail.install.nvidiahook import script


@dataclass(frozen=True)
class Step:
    path: str  # on the node
    why: str
    data: bytes | None = None  # the file ponytail leaves there
    link: str | None = None  # or the link it leaves there (neither: nothing)
    restore: str | None = None  # the one command that puts ponytail's file back where it went missing or changed

    @property
    def leaves(self) -> str:
        if self.link is not None:
            return f"a link to {self.link}"
        return "ponytail's file" if self.data is not None else "nothing"


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    notes: tuple[str, ...]  # what the migration cannot do itself


def make_plan(root: str, toolkit: Toolkit, ponytail: str, runtime: str, spec_files: dict[str, bytes], config_file: str | None = None) -> Plan:
    """``spec_files``: ponytail's CDI spec(s) by path, written where NVIDIA's first spec was."""
    steps: list[Step] = []
    for path in toolkit.specs:
        steps.append(Step(path, "NVIDIA's CDI spec (nvidia-ctk's) of a kind ponytail writes: one generator per kind, "
                                "ponytail's spec takes its place", spec_files.get(path)))
    first = next(iter(spec_files), None)
    with_config = f" -config {os.path.abspath(config_file)}" if config_file else ""
    for path, data in spec_files.items():
        if path not in toolkit.specs:
            why = "ponytail's CDI spec of this host" if path == first else "ponytail's spec of an opt-in feature"
            steps.append(Step(path, why, data, restore=f"ponytail cdi generate --output {first}{with_config}"))
    steps += _boot_steps(root, f"{ponytail} cdi generate --output {first}{with_config}", first)
    hook_script = script(ponytail)
    for path in toolkit.engine_files:
        text = read_text(under(root, path)) or ""  # a symlink, a non-UTF-8 or huge file is refused with one line
        steps.append(Step(path, "its runtime entries run ponytail-runtime instead of nvidia-container-runtime (their names kept)",
                          replace_runtime(text, runtime).encode()))
    install_hook = f"ponytail install-nvidia-hook --at {{path}} --path {ponytail}"
    for path in toolkit.binaries:
        served = SERVED.get(os.path.basename(path))
        if served == "link":
            steps.append(Step(path, "NVIDIA's hook on the engines' PATH: ponytail answers to its name", link=ponytail,
                              restore=f"ln -sf {ponytail} {path}"))
        elif served == "script" or path in toolkit.hook_paths:
            steps.append(Step(path, "NVIDIA's CDI hook on the engines' PATH: ponytail's hook script, for the specs the device "
                                    "plugin and the DRA driver write", data=hook_script, restore=install_hook.format(path=path)))
        else:
            steps.append(Step(path, "NVIDIA's program on the engines' PATH"))
    notes: list[str] = []
    for path in toolkit.hook_paths:
        if path in toolkit.binaries or holds(under(root, path), hook_script):
            continue
        if os.path.dirname(path) not in SERVICE_PATH or not os.path.isdir(under(root, os.path.dirname(path))):
            notes.append(f"a CDI spec left alone names {path} as its hook, which is not on the engines' PATH "
                         f"(or not here): serve it with 'ponytail install-nvidia-hook --at {path}'")
            continue
        steps.append(Step(path, "the hook a CDI spec left alone names: ponytail's hook script", data=hook_script,
                          restore=install_hook.format(path=path)))
    if toolkit.config is not None:
        steps.append(Step(toolkit.config, "NVIDIA's runtime config (ponytail reads /etc/ponytail/config.toml; docs/migration.md maps the keys)"))
    for path, kind in toolkit.kept_specs:
        notes.append(f"{path} (kind {kind}) is left alone: its kind is not one ponytail writes, so its names still resolve "
                     "(its hooks run ponytail's hook script)")
    if toolkit.refresh_units:
        notes.append(f"NVIDIA's {', '.join(toolkit.refresh_units)} regenerates its CDI spec on driver changes (a second spec of "
                     "nvidia.com/gpu again): systemctl disable --now nvidia-cdi-refresh.path nvidia-cdi-refresh.service")
    for hook in toolkit.oci_hooks:
        notes.append(f"NVIDIA's {hook} (podman's hook mode) is left in place: it runs nvidia-container-runtime-hook, "
                     "which is ponytail's link now, so podman's GPU containers of that mode go through ponytail")
    if toolkit.binaries:
        notes.append("a package upgrade of nvidia-container-toolkit puts its programs back: hold or remove the packages "
                     "(apt-mark hold nvidia-container-toolkit nvidia-container-toolkit-base)")
    for step in steps:
        refuse_what_cannot_be_undone(root, step.path)
    return Plan(tuple(steps), tuple(notes))


def boot_unit(command: str, spec: str) -> bytes:
    """The unit that writes ponytail's spec at ``spec`` again at every boot (``command``), before the engines."""
    return f"""# Written by 'ponytail migrate --from nvidia' ('--undo' removes it): {os.path.dirname(spec)} is emptied
# at every boot, so ponytail's CDI spec is written again before the engines start GPU containers.
[Unit]
Description=ponytail: write its CDI spec of this host's GPUs ({spec})
After=systemd-modules-load.service systemd-udev-settle.service nvidia-persistenced.service
Before=containerd.service docker.service crio.service kubelet.service k3s.service k3s-agent.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={command}

[Install]
WantedBy=multi-user.target
""".encode()


def _boot_steps(root: str, command: str, spec: str | None) -> list[Step]:
    """Where ponytail's spec goes to a tmpfs (/var/run/cdi, /run/cdi) on a node that boots with systemd:
    its unit, enabled by its link (no daemon-reload: systemd reads it at the next boot)."""
    if spec is None or not spec.startswith(("/var/run/", "/run/")) or not os.path.isdir(under(root, os.path.dirname(BOOT_WANTS))):
        return []
    return [
        Step(BOOT_UNIT, "writes ponytail's CDI spec at every boot, before the engines (the spec's directory is a tmpfs)",
             boot_unit(command, spec)),
        Step(BOOT_WANTS, "enables it at boot", link=BOOT_UNIT, restore=f"ln -sf {BOOT_UNIT} {BOOT_WANTS}"),
    ]


def refuse_what_cannot_be_undone(root: str, path: str) -> None:
    """One line, before anything changes, for a path whose state a migration could not give back:
    not a regular file or a link, or in a directory it cannot write."""
    full = under(root, path)
    try:
        st = os.lstat(full)
    except FileNotFoundError:
        st = None
    if st is not None and not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        raise PonytailError(f"not migrating: {path} is not a regular file or a link, which could not be put back as it was; move it by hand")
    directory = os.path.dirname(full)
    if not os.access(directory, os.W_OK) or os.statvfs(directory).f_flag & os.ST_RDONLY:
        raise PonytailError(f"not migrating: {os.path.dirname(path)} cannot be written (read-only), so {path} could not be put back")


def remedy(root: str, entry: dict) -> str:
    """The one command that makes a recorded path hold again what the migration left there (for --undo's refusal)."""
    path = entry.get("path", "")
    left = entry.get("left") or {}
    full = under(root, path)
    if left.get("kind") == "nothing" and _is_hook_script_file(full):
        return f"run 'ponytail install-nvidia-hook --uninstall --at {path}' (ponytail's hook script, made since)"
    before = entry.get("before") or {}
    if before.get("kind") == "nothing" and left.get("kind") != "nothing":
        return f"remove {path} (there was nothing there before the migration, and undo leaves nothing)"
    restore = entry.get("restore")
    if isinstance(restore, str) and restore:
        return f"run '{restore}' (it puts back what ponytail left there)"
    if left.get("kind") == "nothing":
        return f"remove {path} (the migration left nothing there)"
    return f"put back what ponytail left at {path}"


def _is_hook_script_file(path: str) -> bool:
    try:
        with open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NOFOLLOW)) as f:
            return b"ponytail-hook-script" in f.read(256)
    except OSError:
        return False
