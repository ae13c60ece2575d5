"""Plain command lines, parsed without importing click.

The hook runs on every container start, ``cdi-hook`` at every CDI container's, ``info`` in
monitoring loops and ``cdi generate`` on every driver change; importing click is most of
what a click command costs before it does anything (bench/importcost.py). Their command
lines are always a few known options, so this reads exactly that: ``-name`` or ``--name``,
``-name VALUE``, ``--name VALUE`` or ``--name=VALUE``; a flag (arity 0) takes no value,
an option of arity N > 1 takes the N words after it; each option once, unless repeatable
(then its values in order); a value with choices must be one of them. Anything else (help,
an unknown, repeated or malformed option, a value not among the choices, a word that is not
an option) gives None, and the click command (ponytail.cli.commands), which takes the same
options, parses it and words the error. tests/unit/test_lite_argv.py holds each of them to click.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported on the hook's path: for type checkers only
    from collections.abc import Collection, Mapping

    Value = str | bool | tuple[str, ...] | tuple[str | tuple[str, ...], ...]


def parse_options(
    args: list[str], arity: Mapping[str, int], repeatable: Collection[str] = (),
    choices: Mapping[str, tuple[str, ...]] | None = None,
) -> dict[str, Value] | None:
    """``{name: value}`` for a plain command line, else None. Names as the table's with ``-``
    as ``_`` (click's parameter names); a value is True for a flag, a string for arity 1, a tuple
    of arity strings above; a repeatable option's is the tuple of its values in order."""
    values: dict[str, Value] = {}
    seen: dict[str, list[str | tuple[str, ...]]] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-") or arg in ("-", "--") or arg.startswith("---"):
            return None
        name, eq, inline = arg.lstrip("-").partition("=")
        n = arity.get(name)
        if n is None or (name in seen and name not in repeatable):
            return None
        value: str | tuple[str, ...]
        if n == 0:
            if eq:
                return None
            seen[name] = [""]
            values[name.replace("-", "_")] = True
            i += 1
            continue
        if eq:
            if n != 1:
                return None
            value = inline
        elif i + n < len(args):
            value = args[i + 1] if n == 1 else tuple(args[i + 1:i + 1 + n])
            i += n
        else:
            return None
        if choices is not None and name in choices and value not in choices[name]:
            return None
        seen.setdefault(name, []).append(value)
        values[name.replace("-", "_")] = tuple(seen[name]) if name in repeatable else value
        i += 1
    return values


def parse_command(
    args: list[str], words: tuple[str, ...], arity: Mapping[str, int], repeatable: Collection[str] = (),
    choices: Mapping[str, tuple[str, ...]] | None = None,
) -> dict[str, Value] | None:
    """parse_options for the words after the subcommand ``words`` (``("cdi", "generate")``);
    None when ``args`` is not that subcommand."""
    if tuple(args[:len(words)]) != words:
        return None
    return parse_options(args[len(words):], arity, repeatable, choices)
