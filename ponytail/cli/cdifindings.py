"""``ponytail check``'s CDI findings: each NVIDIA spec in the engines' spec directories (ponytail's
or another generator's), read as the CDI runtime reads it and checked against the running driver
and GPUs with the test of ``ponytail cdi check``; and each kind that more than one file defines,
which the engines refuse or shadow. Advice never sends ponytail over another generator's file."""

from __future__ import annotations

from ponytail.cli.findings import FAIL, OK, Finding

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ponytail.config import Config


def cdi_findings(root: str, config: Config) -> list[Finding]:
    from ponytail.engines.cdi.files import stale
    from ponytail.engines.cdi.owners import clash_message, clashes, regenerate_advice, scan
    from ponytail.errors import PonytailError

    out = []
    files = scan(root)
    for f in files:
        if f.spec is None:
            if f.kind.startswith("nvidia.com/") or f.generator != "another generator":
                out.append(Finding("engine", "CDI", FAIL, f"{f.error}: the engines refuse it; {regenerate_advice(f)}"))
            continue
        if not f.kind.startswith("nvidia.com/"):
            continue  # another vendor's devices: not ours to judge
        try:
            found = stale(f.spec, config)
        except PonytailError as e:  # no driver loaded: check_host says so already
            found = [e.message]
        if found:
            more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
            out.append(Finding("engine", "CDI", FAIL, f"{f.label} is stale: {found[0]}{more}: {regenerate_advice(f)}"))
        else:
            out.append(Finding("engine", "CDI", OK, f"{f.label} is true for the running driver and GPUs"))
    for kind, group in clashes([f for f in files if f.kind.startswith("nvidia.com/")]).items():
        out.append(Finding("engine", f"CDI {kind}", FAIL, clash_message(kind, group)))
    return out
