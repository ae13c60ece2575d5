"""Which of the registered user-mode driver trees (``[drivers.NAME]``) a container asks for.

A container names one with ``PONYTAIL_DRIVER=NAME`` in its env (or the annotation
``com.example.gpu.driver=NAME``); only registered names are accepted, never a path. Under the
strict Kubernetes policy (``[request] accept_env_when_unprivileged = false``) an unprivileged
container's choice is refused like its NVIDIA_VISIBLE_DEVICES: it gets the host's driver root.
The trees themselves, their versions and whether they may serve: ponytail.host.driver_trees.
"""

from __future__ import annotations

from ponytail.container.gpu_markers import DRIVER_ANNOTATION, DRIVER_VAR


def requested_tree(env: dict[str, str] | None, annotations: dict[str, str] | None, cli_name: str | None = None) -> tuple[str, str] | None:
    """(name, who asked) of the tree a container or the command line asks for, or None.
    The command line wins, then the annotation (set by the engine), then the env."""
    if cli_name is not None:
        return cli_name, "--driver"
    if annotations and annotations.get(DRIVER_ANNOTATION, "").strip():
        return annotations[DRIVER_ANNOTATION].strip(), f"annotation {DRIVER_ANNOTATION}"
    if env and env.get(DRIVER_VAR, "").strip():
        return env[DRIVER_VAR].strip(), DRIVER_VAR
    return None


def refused_tree(asked: tuple[str, str] | None, privileged: bool, accept_env_when_unprivileged: bool) -> str | None:
    """Why the strict policy refuses a container's choice of tree, or None: an unprivileged
    container under ``accept_env_when_unprivileged = false`` chooses no tree, by env or annotation."""
    if asked is None or privileged or accept_env_when_unprivileged:
        return None
    return (
        f"{asked[1]}={asked[0]!r} refused: unprivileged container and [request] accept_env_when_unprivileged = false; "
        "the host's driver root serves it"
    )
