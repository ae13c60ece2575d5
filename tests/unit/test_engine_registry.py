"""The engine registry: every engine has its configure module and its check, the command line
offers exactly the registry's names, and an unknown engine is an error, never another's edit."""

from __future__ import annotations

import pytest

from ponytail.engines import registry
from ponytail.errors import UsageError


def test_every_engine_has_its_edit_and_its_check() -> None:
    from ponytail.doctor.check import ENGINE_CHECKS

    assert set(ENGINE_CHECKS) == set(registry.NAMES)
    for engine in registry.ENGINES:
        assert callable(engine.module().edit), engine.name
        assert engine.config_path.startswith("/") and engine.sockets and engine.runs in ("ponytail", "ponytail-runtime")


def test_the_command_line_offers_the_registrys_engines() -> None:
    import click

    from ponytail.cli.commands import cli

    for command, option in (("configure", "engine"), ("check", "engines")):
        param = next(p for p in cli.commands[command].params if p.name == option)
        assert isinstance(param.type, click.Choice) and tuple(param.type.choices) == registry.NAMES


@pytest.mark.parametrize("name", ["dockr", "", "k8s"])
def test_an_unknown_engine_is_an_error(name: str) -> None:
    from ponytail.install.configure import engine_module

    with pytest.raises(UsageError) as error:
        engine_module(name)
    assert "docker, containerd, crio, podman" in error.value.message
