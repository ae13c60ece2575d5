"""The click command: help that teaches, ``info``, and clear usage errors.

The hook's plain command line is parsed by ponytail.options without importing
click (see ponytail.entry); both routes end in ponytail.hook.run_hook.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Iterator

import click

from ponytail import __version__
from ponytail.options import HOOK_OPTIONS, HookOptions

CONTEXT = {"help_option_names": ["-h", "-help", "--help"], "max_content_width": 100}


def _hook_options(function):  # type: ignore[no-untyped-def]
    for spec in reversed(HOOK_OPTIONS):
        names = (f"-{spec.name}", f"--{spec.name}")
        if spec.metavar is None:
            function = click.option(*names, spec.name, is_flag=True, help=spec.help)(function)
        else:
            function = click.option(*names, spec.name, metavar=spec.metavar, help=spec.help)(function)
    return function


@click.group(invoke_without_command=True, context_settings=CONTEXT)
@_hook_options
@click.version_option(__version__, "-version", "--version", prog_name="ponytail")
@click.pass_context
def cli(ctx: click.Context, **values: object) -> None:
    """Give a container the host's NVIDIA GPUs (an OCI prestart hook).

    \b
    Hook mode (no -root): the container engine runs ponytail with the OCI state
    on stdin; it reads the bundle's config.json, enters the container's mount
    namespace and bind-mounts the GPU device nodes, the driver's libraries and
    nvidia-smi into the rootfs, then refreshes the rootfs's linker cache.

    \b
    Examples:
      ponytail -debug                                 # what would be injected here
      ponytail -root /tmp/test-rootfs -device 0       # inject GPU 0 into a rootfs by hand
      ponytail -root /tmp/test-rootfs -libs /usr/lib/x86_64-linux-gnu/libcuda.so.1
      ponytail info --json                            # driver version and GPUs

    Exit status: 0 done, 1 injection failed, 2 bad usage, config or input.
    Every run is logged to [log] file (default /var/log/ponytail.log).
    """
    if ctx.invoked_subcommand is None:
        from ponytail.hook import run_hook

        ctx.exit(run_hook(HookOptions(**values)))  # type: ignore[arg-type]


@cli.command(context_settings=CONTEXT)
@click.option("--json", "-json", "as_json", is_flag=True, help="Print JSON: {driver_version, cuda_version, gpus: [...]}.")
@click.option("-config", "--config", "config", metavar="FILE", help="Config file (as for the hook).")
def info(as_json: bool, config: str | None) -> None:
    """Driver and CUDA version, and each GPU's index, minor, PCI bus id, UUID, model and MIG devices.

    The index is the GPU's position in PCI bus order (what nvidia-smi shows);
    the minor is the N of /dev/nvidiaN, which need not equal the index.
    """
    from ponytail.infocmd import run_info

    code = run_info(as_json, config)
    if code:
        sys.exit(code)


@cli.command("list", context_settings=CONTEXT)
@click.option("-config", "--config", "config", metavar="FILE", help="Config file (as for the hook).")
@click.option("-device", "--device", "device", metavar="SEL", default="all", show_default=True, help="GPUs, as for the hook.")
@click.option("-capabilities", "--capabilities", "capabilities", metavar="LIST", help="Driver capabilities (default utility,compute).")
def list_paths(config: str | None, device: str, capabilities: str | None) -> None:
    """Every host path that would be injected, one per line: device nodes, libraries,
    binaries, driver files and firmware, daemons' sockets (like nvidia-container-cli list)."""
    from ponytail.config import config_path, load_config
    from ponytail.hook import make_plan
    from ponytail.request import build_request

    with _errors():
        loaded = load_config(*config_path(config))
        plan, _ = make_plan(loaded, build_request(device, capabilities, None), None, dry_run=False)
    for path in plan.host_paths():
        click.echo(path)


@contextmanager
def _errors() -> Iterator[None]:
    """Our errors as one line on stderr with their exit status."""
    from ponytail.errors import PonytailError

    try:
        yield
    except PonytailError as e:
        click.echo(f"ponytail: error: {e.message}", err=True)
        sys.exit(e.exit_code)


@cli.command("install-hook", context_settings=CONTEXT)
@click.option("--dir", "-dir", "directory", metavar="DIR", default=None,
              help="Hooks directory. Default: /usr/share/containers/oci/hooks.d (what Debian's podman reads).")
@click.option("--config", "-config", "config", metavar="FILE", default=None,
              help="Config file the hook is run with. Default: /etc/ponytail/config.toml.")
@click.option("--path", "-path", "command", metavar="CMD", default=None,
              help="The hook command. Default: this install's ponytail command.")
def install_hook(directory: str | None, config: str | None, command: str | None) -> None:
    """Write ponytail.json into a hooks.d directory (podman, CRI-O).

    \b
    The hook runs at prestart of containers started with the annotation
    com.example.gpu=true, e.g.
      podman run --annotation com.example.gpu=true -e NVIDIA_VISIBLE_DEVICES=0 IMAGE nvidia-smi
    Its path is this install's absolute ponytail command: podman silently skips a hook
    whose path does not exist. Podman 4.3 on Debian reads only
    /usr/share/containers/oci/hooks.d, or the directories given with --hooks-dir.
    """
    from ponytail.config import DEFAULT_CONFIG_PATH
    from ponytail.errors import UsageError
    from ponytail.hooksd import DEFAULT_HOOKS_DIR, install_hook as write_hook_file, installed_command

    config = config or DEFAULT_CONFIG_PATH
    command = command or installed_command()
    with _errors():
        if command is None:
            raise UsageError("cannot find this install's ponytail command; pass --path CMD")
        path = write_hook_file(directory or DEFAULT_HOOKS_DIR, command, config)
    click.echo(f"wrote {path}: runs {command} -config {config} at prestart of containers annotated com.example.gpu=true")
    if not os.path.exists(config):
        click.echo(f"ponytail: warning: {config} does not exist yet; GPU containers will fail to start until it does", err=True)
