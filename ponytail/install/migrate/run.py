"""The migration from NVIDIA's toolkit, end to end: probe, plan (with ponytail's CDI spec made in
memory first, so that a host ponytail cannot describe changes nothing), then apply or print."""

from __future__ import annotations

import os
from contextlib import contextmanager

from ponytail.cdi.files import feature_spec_path, form_of, generate, render
from ponytail.config import config_path, load_config
from ponytail.errors import PonytailError, UsageError, os_failure
from ponytail.install.migrate import apply as transaction
from ponytail.install.migrate.apply import DEFAULT_STATE_DIR, apply, resume
from ponytail.install.migrate.journal import read_record
from ponytail.install.migrate.nvidia import probe
from ponytail.install.migrate.plan import make_plan

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator

SOURCES = ("nvidia",)

__all__ = ["DEFAULT_STATE_DIR", "SOURCES", "migrate", "undo"]


def migrate(root: str, state_dir: str, ponytail: str, runtime: str, config_file: str | None, dry_run: bool) -> list[str]:
    with _one_line("not migrating", f"run ponytail migrate --from nvidia{' --dry-run' if dry_run else ''} again"):
        return _migrate(root, state_dir, ponytail, runtime, config_file, dry_run)


def undo(root: str, state_dir: str, dry_run: bool = False) -> list[str]:
    with _one_line("not undoing", "run ponytail migrate --from nvidia --undo again"):
        return transaction.undo(root, state_dir, dry_run)


@contextmanager
def _one_line(doing: str, then: str) -> Iterator[None]:
    """An error of the file system the steps did not expect as one line (what, where, what to do), never a traceback."""
    try:
        yield
    except OSError as e:  # the steps keep the record whole: a rerun completes or undoes whatever was done
        error = os_failure(f"{doing}: {e.filename or 'a file'}", e, PonytailError)
        raise type(error)(f"{error.message}; {then}") from e


def _migrate(root: str, state_dir: str, ponytail: str, runtime: str, config_file: str | None, dry_run: bool) -> list[str]:
    for command in (ponytail, runtime):
        if not os.path.isabs(command):
            raise UsageError(f"{command}: the ponytail commands are named by absolute paths (the engines run them from anywhere)")
    record = read_record(root, state_dir, "not migrating")
    if record is not None:  # a migration, complete (refused) or interrupted (completed now)
        return resume(root, state_dir, record, dry_run)
    toolkit = probe(root)
    if toolkit.empty:
        return ["nothing of NVIDIA's container toolkit found here (its CDI specs, engine entries, hooks on PATH, config): nothing to migrate"]
    made = _ponytail_specs(toolkit.specs, ponytail, config_file) if toolkit.specs else {}
    specs = {path: data for path, (kind, data) in made.items() if not _ponytail_has_kind(root, kind)}  # one owner per kind
    plan = make_plan(root, toolkit, ponytail, runtime, specs, config_file)
    if dry_run:
        lines = [f"would: {s.path}: {s.why}; then {s.leaves} there (the original kept for --undo)" for s in plan.steps]
        return lines + [f"note: {n}" for n in plan.notes] + ["dry run: nothing changed"]
    lines = apply(root, state_dir, plan, "nvidia")
    return lines + [f"note: {n}" for n in plan.notes] + ["restart the engines to apply (systemctl restart docker containerd crio)"]


def _ponytail_specs(nvidia_specs: tuple[str, ...], ponytail: str, config_file: str | None) -> dict[str, tuple[str, bytes]]:
    """ponytail's spec of this host (and of its opt-in features), by the node path it goes to (ponytail.yaml
    beside NVIDIA's first spec, its format kept: .json or .yaml): its kind and bytes."""
    first = nvidia_specs[0]
    target = os.path.join(os.path.dirname(first), "ponytail" + (".json" if first.endswith(".json") else ".yaml"))
    spec, _, features = generate(load_config(*config_path(config_file)), ponytail)
    form = form_of(first, None)
    out = {target: (spec["kind"], render(spec, form))}
    for name, feature in features.items():
        out[feature_spec_path(target, name)] = (feature["kind"], render(feature, form))
    return out


def _ponytail_has_kind(root: str, kind: str) -> bool:
    """A spec of ponytail's of ``kind`` is in the engines' spec directories already."""
    from ponytail.cdi.owners import PONYTAIL, scan  # here: every command loads this module (cli.migrate), not this import

    return any(f.generator == PONYTAIL and f.kind == kind for f in scan(root))
