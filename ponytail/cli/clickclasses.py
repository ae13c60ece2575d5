"""The click classes every ponytail command is made of.

Three rules hold for every command and subcommand, whoever declares its options:

- every long option takes both spellings, ``-name`` and ``--name`` (declaring one adds the other);
- a misspelled option is named as typed, with the nearest ones (``No such option: -devcie Did you
  mean -device?``), where click alone would name the first letter of a single-dash one (``-d``);
- the ``ponytail`` options given before a subcommand (``ponytail -config FILE info``) apply to it
  as if given after it (an option after it wins); one the subcommand does not have is an error
  that says so (``ponytail -debug info``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from difflib import get_close_matches

import click
from click.core import ParameterSource

from ponytail.errors import PonytailError

# click 8.2 raises this for a group named without a subcommand; before 8.2 (Debian 12 has 8.1.3,
# debian/control admits 8.0) the group prints its help itself and exits 0, and the name is missing
_NO_ARGS_IS_HELP: tuple[type[BaseException], ...] = tuple(
    e for e in (getattr(click.exceptions, "NoArgsIsHelpError", None),) if isinstance(e, type)
)

CONTEXT = {"help_option_names": ["-h", "-help", "--help"], "max_content_width": 100}
_BEFORE = "ponytail.options_before_subcommand"  # ctx.meta key: [(spelling as typed, parameter name, value)]


def add_both_spellings(params: list[click.Parameter]) -> None:
    """Give each long option its other spelling: ``-name`` beside ``--name`` and back."""
    for param in params:
        if not isinstance(param, click.Option):
            continue
        for opts in (param.opts, param.secondary_opts):
            for opt in list(opts):
                if opt.startswith("--") and len(opt) > 3:
                    twin, at = opt[1:], opts.index(opt)  # -name before --name, as the help lists them
                elif opt.startswith("-") and not opt.startswith("--") and len(opt) > 2:
                    twin, at = "-" + opt, opts.index(opt) + 1
                else:
                    continue
                if twin not in param.opts and twin not in param.secondary_opts:
                    opts.insert(at, twin)


def spellings(command: click.Command, ctx: click.Context) -> list[str]:
    """Every option spelling ``command`` takes."""
    return [o for p in command.get_params(ctx) if isinstance(p, click.Option) for o in (*p.opts, *p.secondary_opts)]


def _as_typed(command: click.Command, ctx: click.Context, args: list[str], error: click.NoSuchOption) -> click.NoSuchOption:
    """The unknown option as the user typed it, with the nearest known spellings of the same dashes."""
    known = spellings(command, ctx)
    for at, token in enumerate(args):
        if token == "--":  # noqa: S105 - a command-line token, not a password
            break
        name = token.split("=", 1)[0]
        if name.startswith("-") and name not in known and name.startswith(error.option_name):
            sub = _subcommand_taking(command, ctx, args[at + 1:], name)
            if sub is not None:  # ponytail -json info: an option of the subcommand, before it
                return click.NoSuchOption(name, f"{name} is an option of '{ctx.command_path} {sub}': put it after '{sub}'", ctx=ctx)
            dashes = "--" if name.startswith("--") else "-"
            alike = [k for k in known if k.startswith(dashes) and (dashes == "--" or not k.startswith("--"))]
            return click.NoSuchOption(name, possibilities=get_close_matches(name, alike, n=3, cutoff=0.7), ctx=ctx)
    return error


def _subcommand_taking(group: click.Command, ctx: click.Context, rest: list[str], name: str) -> str | None:
    """The first of ``rest`` that names a subcommand of ``group`` taking the option ``name``."""
    if not isinstance(group, click.Group):
        return None
    for word in rest:
        sub = group.commands.get(word)
        if sub is not None:
            return word if name in spellings(sub, ctx) else None
    return None


class _Named(click.Command):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]  # click's own signature
        add_both_spellings(self.params)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        typed = list(args)  # click's parser consumes the list it is given
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as e:
            raise _as_typed(self, ctx, typed, e) from None


class Command(_Named):
    """A leaf command: takes the options given before its name (see remember_options_before)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        for typed, name, value in ctx.meta.get(_BEFORE, ()):
            long = f"--{name}"
            param = next((p for p in self.get_params(ctx) if isinstance(p, click.Option) and long in (*p.opts, *p.secondary_opts)), None)
            if param is None or param.name is None:
                raise click.UsageError(
                    f"{typed} (given before the subcommand) is not an option of '{ctx.command_path}': "
                    f"see '{ctx.command_path} --help'; ponytail's own {typed} goes without a subcommand",
                    ctx,
                )
            if ctx.get_parameter_source(param.name) in (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP, None):
                ctx.params[param.name] = param.type_cast_value(ctx, value) if not isinstance(value, bool) else value
        return rest


class _OneLine(click.ClickException):
    exit_code = 2  # bad usage, as every ponytail command

    def show(self, file: object = None) -> None:
        click.echo(f"ponytail: error: {self.format_message()}", err=True)


class OneLineErrors(Command):
    """A command an engine runs (not a person): a usage error is one line, without click's usage lines."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:
            raise _OneLine(f"{ctx.info_name}: {e.format_message()} (see '{ctx.command_path} --help')") from None


class Group(_Named, click.Group):
    """A group whose commands and subgroups are of these classes."""

    command_class = Command
    group_class = type  # a subgroup is a Group too


def run_main(group: click.Group, args: list[str]) -> int:
    """Run the click ``group`` on ``args``; the exit status. A usage error is one line on stderr,
    as every error of ponytail's (``ponytail: error: No such option ... (see 'ponytail info --help')``),
    and a group named without a subcommand prints its help and exits 0."""
    try:
        done = group.main(args=args, prog_name="ponytail", standalone_mode=False)
    except _NO_ARGS_IS_HELP as e:  # 'ponytail cdi': what it offers
        ctx = getattr(e, "ctx", None)
        click.echo(ctx.get_help() if ctx is not None else group.get_help(click.Context(group)))
        return 0
    except click.UsageError as e:
        where = e.ctx.command_path if e.ctx is not None else "ponytail"
        message = " ".join(e.format_message().split()).rstrip(".")  # click's choice lists span lines
        click.echo(f"ponytail: error: {message} (see '{where} --help')", err=True)
        return e.exit_code
    except click.ClickException as e:
        e.show()
        return e.exit_code
    except click.Abort:
        click.echo("Aborted!", err=True)
        return 1
    return done if isinstance(done, int) else 0


def remember_options_before(ctx: click.Context, names: list[str]) -> None:
    """Keep the options among ``names`` that were given on the command line before the
    subcommand, for the subcommand (Command.parse_args) to take."""
    given = []
    for name in names:
        if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE:
            given.append((f"-{name}", name, ctx.params[name]))
    ctx.meta[_BEFORE] = given


@contextmanager
def one_line_errors() -> Iterator[None]:
    """Our errors as one line on stderr with their exit status."""
    try:
        yield
    except PonytailError as e:
        click.echo(f"ponytail: error: {e.message}", err=True)
        sys.exit(e.exit_code)
