"""The click command: help that teaches, ``info``, and clear usage errors.

The hook's plain command line is parsed by ponytail.options without importing
click (see ponytail.entry); both routes end in ponytail.hook.run_hook.
"""

from __future__ import annotations

import json
import sys

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
@click.option("--json", "-json", "as_json", is_flag=True, help="Print JSON: {driver_version, gpus: [...]}.")
@click.option("-config", "--config", "config", metavar="FILE", help="Config file (as for the hook).")
def info(as_json: bool, config: str | None) -> None:
    """Driver version and each GPU's index, minor, PCI bus id, UUID and model.

    The index is the GPU's position in PCI bus order (what nvidia-smi shows);
    the minor is the N of /dev/nvidiaN, which need not equal the index.
    """
    from ponytail.config import config_path, load_config
    from ponytail.errors import PonytailError
    from ponytail.host.probe import probe_gpus

    try:
        found = probe_gpus(load_config(*config_path(config)))
    except PonytailError as e:
        click.echo(f"ponytail: error: {e.message}", err=True)
        sys.exit(e.exit_code)
    if as_json:
        gpus = [
            {"index": g.index, "minor": g.minor, "pci_bus_id": g.pci_bus_id, "uuid": g.uuid, "model": g.model}
            for g in found.gpus
        ]
        click.echo(json.dumps({"driver_version": found.driver_version, "gpus": gpus}, indent=2))
    else:
        from ponytail.render import render_gpus

        click.echo(render_gpus(found.driver_version, found.gpus, found.notes), nl=False)
