"""NVIDIA's hook command lines in a CDI spec, read before a start reads them.

The specs of nvidia-ctk, NVIDIA's device plugin and its DRA driver run ``nvidia-cdi-hook SUBCOMMAND
--flag ...`` (older ones ``nvidia-ctk hook ...``) at each container start. Where those paths run
ponytail (``ponytail install-nvidia-hook``), ponytail.hooks.nvidia reads each line. ``unserved``
reads them now, with the same parser, and names each line a start would not serve:

- an unknown subcommand (a spec from a newer toolkit): each start skips it with a warning, as
  NVIDIA's own binary does, or stops where ``[cdi] unknown_nvidia_hooks = "fail"``;
- any other usage error, such as an unknown flag: each start stops.

The doctor, ``install-nvidia-hook --spec`` and the guard's spec refresh say them.
"""

from __future__ import annotations

from ponytail.cdi.skim import Hook
from ponytail.errors import UsageError
from ponytail.hooks.nvidia import UnknownSubcommand, parse_hook_line
from ponytail.lite.records import record

MAX_LINE = 120  # a line is cut here when said (a create-symlinks line names every link)


@record(frozen=True)
class Unserved:
    line: str  # the hook's command line: its path and arguments
    subcommand: str  # the subcommand ponytail does not serve; "" where the line has another usage error
    why: str  # the hook's own words

    def stops_a_start(self, fail: bool) -> bool:
        """Whether a start with this hook stops (``fail``: [cdi] unknown_nvidia_hooks is "fail")."""
        return fail or not self.subcommand

    def said(self, where: str, fail: bool | None) -> str:
        """One line: ``where`` (the spec) runs it, and what a start makes of it (``fail`` None: the
        config is not known here)."""
        head = f"{where} runs '{self.line}'"
        if not self.subcommand:
            return f"{head}, which ponytail's hook refuses ({self.why}): every start with it stops; {_ADVICE}"
        doing = f"ponytail does not serve the hook subcommand {self.subcommand!r} (a spec from a newer toolkit?)"
        if fail is None:
            return (f"{head}: {doing}: a start skips it with a warning, as NVIDIA's own hook does, "
                    f'or stops where [cdi] unknown_nvidia_hooks = "fail"; {_ADVICE}')
        if fail:
            return f'{head}: {doing}, and [cdi] unknown_nvidia_hooks = "fail" stops every start with it; {_ADVICE}, or set it to "warn"'
        return f"{head}: {doing}: each start skips it with a warning, as NVIDIA's own hook does; {_ADVICE}"


_ADVICE = "generate the spec with a toolkit whose hooks ponytail serves"


def unserved(hooks: tuple[Hook, ...] | list[Hook]) -> list[Unserved]:
    """The hooks, of a spec's (path, args), that run one of NVIDIA's hook names and that ponytail's
    hook would not serve, each line once, in the spec's order."""
    found: dict[str, Unserved] = {}
    for path, args in hooks:
        parsed = parse_hook_line(path, list(args))
        if not isinstance(parsed, UsageError):
            continue
        line = " ".join((path, *args[1:]))
        if len(line) > MAX_LINE:
            line = line[:MAX_LINE - 3] + "..."
        subcommand = parsed.subcommand if isinstance(parsed, UnknownSubcommand) else ""
        found.setdefault(line, Unserved(line, subcommand, parsed.message))
    return list(found.values())
