"""The engine registry: every engine has its module (its edit, and registered() reading back what the
edit wrote), the command line offers exactly the registry's names, and an unknown engine is an error,
never another's edit. Only the engines' modules tell one engine from another."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ponytail.engines import registry
from ponytail.errors import UsageError

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "ponytail"


def test_every_engine_has_its_edit_and_reads_it_back(tmp_path: Path) -> None:
    for engine in registry.ENGINES:
        module = engine.module()
        assert callable(module.edit) and callable(module.registered) and callable(module.unregistered), engine.name
        assert engine.config_path.startswith("/") and engine.sockets and engine.runs in ("ponytail", "ponytail-runtime")
        assert module.CONFIG_PATH == engine.config_path, engine.name  # one default file, for configure and check alike
        assert engine.registered(str(tmp_path)) is None  # an empty node registers nothing
        assert engine.unregistered(str(tmp_path)).what, engine.name
    assert all(registry.engine(e.backend_of) for e in registry.ENGINES if e.backend_of)


def test_only_the_engines_modules_tell_one_engine_from_another() -> None:
    """The doctor, configure and the command line loop over the registry: a test of an engine's name is
    the engine's own knowledge, which belongs in its module."""
    branching = re.compile(r"""\bengine(?:\.name)?\s*[!=]=|[!=]=\s*engine(?:\.name)?\b|\bengine(?:\.name)?\s+(?:not\s+)?in\s*\(\s*["']""")
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py")) if "engines" not in path.relative_to(PACKAGE).parts[:1]
        for number, line in enumerate(path.read_text().splitlines(), 1) if branching.search(line)
    ]
    assert not found, "\n".join(found)


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
