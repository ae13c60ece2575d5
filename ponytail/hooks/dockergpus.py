"""Docker's ``--gpus`` hook as dockerd runs it: under the name ``nvidia-container-runtime-hook``, with
``prestart`` (ponytail.install.dockergpus makes that name lead to ponytail)."""

from __future__ import annotations

from ponytail.errors import UsageError

HOOK_NAME = "nvidia-container-runtime-hook"
HOOK_VERBS_WITHOUT_WORK = ("poststart", "poststop")  # NVIDIA's hook does nothing at these either


def hook_arguments(args: list[str]) -> list[str] | None:
    """The ponytail command line for a run under ``HOOK_NAME`` with ``args`` (Docker passes
    ``prestart``): the hook's own (none: hook mode, the OCI state on stdin), None for a stage
    with nothing to do. Anything else is a usage error."""
    if args[:1] == ["prestart"]:
        return args[1:]
    if args[:1] and args[0] in HOOK_VERBS_WITHOUT_WORK:
        return None
    said = " ".join(args) if args else "nothing"
    raise UsageError(f"run as {HOOK_NAME} (Docker's --gpus hook), ponytail takes 'prestart', not {said}")
