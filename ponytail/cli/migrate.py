"""``ponytail migrate --from nvidia``: the click command (ponytail.install.migrate does the work)."""

from __future__ import annotations

import os

import click

from ponytail.cli.clickclasses import CONTEXT, Command, one_line_errors
from ponytail.errors import UsageError
from ponytail.hooks.command import installed_command
from ponytail.install.migrate import run
from ponytail.install.migrate.run import DEFAULT_STATE_DIR, SOURCES


@click.command(cls=Command, context_settings=CONTEXT)
@click.option("--from", "source", type=click.Choice(SOURCES), required=True, help="Whose container toolkit to move aside.")
@click.option("--undo", is_flag=True, help="Put every file back as it was before the migration, byte for byte.")
@click.option("--dry-run", "dry_run", is_flag=True, help="Say each step; change nothing.")
@click.option("-config", "--config", "config", metavar="FILE", help="Config file (as for the hook): the CDI spec ponytail writes is of this host.")
@click.option("--path", "command", metavar="CMD", default=None, help="The ponytail command (default: this install's); ponytail-runtime beside it.")
@click.option("--root", "root", metavar="DIR", default="/", show_default=True, help="The node's / (e.g. /host from a pod, or an image root).")
@click.option("--state-dir", "state_dir", metavar="DIR", default=DEFAULT_STATE_DIR, show_default=True,
              help="Where the originals and the record are kept (under --root; no engine reads there).")
def migrate(source: str, undo: bool, dry_run: bool, config: str | None, command: str | None, root: str, state_dir: str) -> None:
    """Move NVIDIA's container toolkit aside and put ponytail in its place, reversibly.

    \b
    NVIDIA's CDI specs of nvidia.com/gpu (ponytail's spec, ponytail.yaml, goes beside the
    first; a unit writes it again at boot where that is /var/run/cdi; specs of other kinds,
    the device plugin's and the GPU Operator's, are left alone), its engine entries (docker
    daemon.json, containerd config.toml and conf.d, CRI-O crio.conf and crio.conf.d: the
    runtime 'nvidia' then runs ponytail-runtime), its hooks on PATH
    (nvidia-container-runtime-hook becomes a link to ponytail, nvidia-cdi-hook and a
    nvidia-ctk that a spec names become ponytail's hook script) and its config
    (/etc/nvidia-container-runtime/config.toml) are each kept in --state-dir. --undo checks
    that each path holds what the migration left, then puts every file back byte for byte.
    Anything it could not put back is refused with one line before anything changes.
    A run stopped half-way (killed, a full disk) is completed by running it again, or
    undone by --undo.
      ponytail migrate --from nvidia --dry-run
      ponytail migrate --from nvidia && systemctl restart docker containerd
      ponytail migrate --from nvidia --undo
    """
    with one_line_errors():
        if undo:
            lines = run.undo(root, state_dir, dry_run)
        else:
            lines = run.migrate(root, state_dir, *_commands(command), config, dry_run)
    for line in lines:
        click.echo(line)


def _commands(command: str | None) -> tuple[str, str]:
    ponytail = command or installed_command()
    if ponytail is None:
        raise UsageError("cannot find this install's ponytail command; pass --path CMD")
    runtime = os.path.join(os.path.dirname(ponytail), "ponytail-runtime")
    if not os.access(runtime, os.X_OK):
        raise UsageError(f"no ponytail-runtime beside {ponytail}: install ponytail whole, or pass --path to an install that has it")
    return ponytail, runtime
