"""NVIDIA's command lines as a migrating user types them: an alias where the habit has one meaning in
ponytail (``ponytail runtime configure --runtime=docker`` is ``ponytail configure --runtime docker``),
and an error that points at the equivalent where it has none (``ponytail config --set ...``: ponytail's
settings are keys of its config file). docs/migration.md lists each."""

from __future__ import annotations

import sys

import click

from ponytail.cli.clickclasses import CONTEXT, Command, Group, one_line_errors

_PASS_ANYTHING = {**CONTEXT, "ignore_unknown_options": True, "allow_extra_args": True}


@click.group(cls=Group, context_settings=CONTEXT)
def runtime() -> None:
    """nvidia-ctk's 'runtime' commands: 'ponytail runtime configure' is 'ponytail configure'."""


@runtime.command("configure", context_settings=CONTEXT)
@click.option("--runtime", "engine", default="docker", show_default=True, type=click.Choice(["docker", "containerd", "crio"]),
              help="The engine whose configuration to edit (as nvidia-ctk's).")
@click.option("--config", "config_file", metavar="PATH", default=None, help="The engine's config (ponytail configure --config-file).")
@click.option("--set-as-default", "--nvidia-set-as-default", "set_as_default", is_flag=True, help="Make ponytail the default runtime.")
@click.option("--dry-run", "dry_run", is_flag=True, help="Print the change as a diff; write nothing.")
@click.option("--nvidia-runtime-name", "name", default="ponytail", show_default=True, help="The runtime's name (ponytail configure --name).")
@click.option("--nvidia-runtime-path", "--runtime-path", "command", metavar="CMD", default=None,
              help="The runtime command the engine runs (ponytail configure --path; default: this install's ponytail-runtime).")
@click.option("--drop-in-config", "drop_in", metavar="PATH", default=None, help="containerd 2.x: the drop-in to write (ponytail configure's).")
@click.option("--state-dir", "state_dir", metavar="DIR", default="/var/lib/ponytail/configure", show_default=True,
              help="As ponytail configure's: where the file as it was is kept, for 'ponytail configure --uninstall'.")
def runtime_configure(engine: str, config_file: str | None, set_as_default: bool, dry_run: bool, name: str,
                      command: str | None, drop_in: str | None, state_dir: str) -> None:
    """nvidia-ctk's 'runtime configure', done by 'ponytail configure' (same options, ponytail's runtime).

    \b
      ponytail runtime configure --runtime=containerd --dry-run
      ponytail runtime configure --runtime=docker --set-as-default
    """
    from ponytail.install.configure import configure as run_configure

    with one_line_errors():
        lines = run_configure(engine, config_file, command, name, set_as_default, dry_run, False, state_dir, drop_in)
    click.echo("\n".join(lines))


@click.command("config", cls=Command, hidden=True, context_settings=_PASS_ANYTHING)
@click.pass_context
def config(ctx: click.Context) -> None:
    """nvidia-ctk's 'config': ponytail has no such command (its settings are keys of its config file)."""
    said = " ".join(["config", *ctx.args])
    click.echo(f"ponytail: error: 'ponytail {said}' is nvidia-ctk's habit; ponytail's settings are keys of its config file "
               "/etc/ponytail/config.toml (every key: docs/configuration.md; NVIDIA's config.toml keys and ponytail's: "
               "docs/migration.md); edit that file, or pass -config FILE", err=True)
    sys.exit(2)
