"""``ponytail cdi generate``: this host's spec, written where it belongs, refusing a second owner of a
kind. The click command (ponytail.cli.cdi), the plain command line (ponytail.cli.cdigenerate) and the
guard's spec refresh (ponytail.guard.daemon) all end here."""

from __future__ import annotations

import os
import sys

from ponytail.capabilities import FEATURES
from ponytail.cdi.files import DEFAULT_STRATEGY, SPEC_DIRS, feature_spec_path, form_of, generate, render, write_atomically
from ponytail.cdi.owners import Scans, write_refusal
from ponytail.config import config_path, load_config
from ponytail.errors import PonytailError, UsageError


def run_generate(
    output: str | None = None, form: str | None = None, strategy: str = DEFAULT_STRATEGY, version: str | None = None,
    capabilities: str = "all", hook_path: str | None = None, config: str | None = None,
) -> int:
    """Write this host's spec (to ``output``, else stdout); errors as one line. The exit status."""
    try:
        loaded = load_config(*config_path(config))
        command = hook_path
        if command is None:
            # here, not at the top: hooks.command (with what it loads) is needed only without --hook-path
            from ponytail.hooks.command import installed_command

            command = installed_command()
        if command is None or not os.path.isabs(command):
            raise UsageError("cannot find this install's ponytail command by an absolute path; pass --hook-path CMD")
        spec, warnings, features = generate(loaded, command, strategy, capabilities, version)
        data = render(spec, form_of(output, form))
        for warning in warnings:
            print(f"ponytail: warning: {warning}", file=sys.stderr)
        if output is None or output == "-":
            sys.stdout.flush()
            sys.stdout.buffer.write(data)
            return 0
        if not output.endswith((".yaml", ".json")):
            print(f"ponytail: warning: engines read only .yaml and .json files; {output} will be ignored by them", file=sys.stderr)
        _refuse_a_second_owner(output, spec, features, tuple(FEATURES))
        write_atomically(output, data)
        written = [(output, spec)]
        if os.path.dirname(os.path.abspath(output)) in SPEC_DIRS:  # the engines read it: it must outlive the checkout
            from ponytail.hooks.command import transient_warning  # here: as installed_command above

            transient = transient_warning(command)
            if transient is not None:
                print(f"ponytail: warning: {transient}", file=sys.stderr)
        for feature in FEATURES:  # the multi-node features this host has, each a kind of its own, beside it
            path = feature_spec_path(output, feature)
            if feature in features:
                write_atomically(path, render(features[feature], form_of(output, form)))
                written.append((path, features[feature]))
            elif os.path.lexists(path):
                try:
                    os.unlink(path)  # the host no longer has it
                except OSError as e:
                    raise UsageError(f"cannot remove {path}, the spec of a feature this host no longer has: {e.strerror}") from e
    except PonytailError as e:
        print(f"ponytail: error: {e.message}", file=sys.stderr)
        return e.exit_code
    for path, done in written:
        names = ", ".join(f"{done['kind']}={d['name']}" for d in done["devices"])
        print(f"wrote {path}: cdiVersion {done['cdiVersion']}, {len(done['devices'])} device(s): {names}", file=sys.stderr)
    return 0


def _refuse_a_second_owner(output: str, spec: dict, features: dict[str, dict], names: tuple[str, ...]) -> None:
    """One owner per CDI kind: nothing is written when another file defines a kind ponytail would
    write (the engines refuse or shadow a kind two files define), or ``output`` is another generator's."""
    planned = [(output, spec)] + [(feature_spec_path(output, n), features[n]) for n in names if n in features]
    scanned = Scans()  # each spec file read once for all of them
    for path, written in planned:
        refusal = write_refusal(written["kind"], path, scanned=scanned)
        if refusal is not None:
            raise PonytailError(refusal)
