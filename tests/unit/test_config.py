"""config.toml: defaults, precedence, and errors that name the file and the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ponytail.config import DEFAULT_CONFIG_PATH, Config, config_path, load_config
from ponytail.errors import ConfigError
from ponytail.lite.records import replace


def test_shipped_example_config_is_valid() -> None:
    shipped = Path(__file__).resolve().parents[2] / "config" / "config.toml"
    config = load_config(str(shipped), required=True)
    # the example spells out the built-in defaults: a missing file means exactly these
    assert replace(config, path=None) == Config()
    assert config.capability_extras == {}


def test_missing_default_means_defaults_and_missing_explicit_is_an_error(tmp_path: Path) -> None:
    assert load_config(str(tmp_path / "nope.toml"), required=False) == Config()
    with pytest.raises(ConfigError, match="nope.toml does not exist"):
        load_config(str(tmp_path / "nope.toml"), required=True)


def test_precedence_cli_then_env_then_default() -> None:
    assert config_path("/a.toml", {"PONYTAIL_CONFIG": "/b.toml"}) == ("/a.toml", True)
    assert config_path(None, {"PONYTAIL_CONFIG": "/b.toml"}) == ("/b.toml", True)
    assert config_path(None, {}) == (DEFAULT_CONFIG_PATH, False)


@pytest.mark.parametrize(
    "text, message",
    [
        ("[host]\ndriver_rot = '/'\n", r"unknown key 'host.driver_rot'"),
        ("[hots]\n", r"unknown table \[hots\]"),
        ("[host]\ndriver_root = 3\n", r"'host.driver_root' must be a string, not an integer"),
        ("[host]\ndriver_root = 'relative'\n", r"must be an absolute path"),
        ("[library]\npaths = '/usr/lib/libcuda.so.*'\n", r"'library.paths' must be a list of strings"),
        ("[library]\npaths = ['libcuda.so.*']\n", r"must be an absolute path or glob"),
        ("[log]\nfile = true\n", r"'log.file' must be a string, not a boolean"),
        ("[cache]\ndir = 'run/ponytail'\n", r"'cache.dir' must be an absolute path"),
        ("host = 1\n", r"'host' must be a table"),
        ("[host\n", r"TOML syntax error"),
        ("[request]\nenv_namespaces = ['gpu-operator']\n", r"'request.env_namespaces' needs 'request.cri'"),
        ("[request]\ncri = 'docker'\n", r"'request.cri' must be one of 'containerd', 'cri-o', not 'docker'"),
        ("[request]\ncri = 'cri-o'\nenv_namespaces = ['GPU_operator']\n", r"entry 'GPU_operator' is not a Kubernetes namespace name"),
        ("[request]\ncri = 'containerd'\nenv_namespaces = 'gpu-operator'\n", r"'request.env_namespaces' must be a list of strings"),
        ("[cdi]\nunknown_nvidia_hooks = 'ignore'\n", r"'cdi.unknown_nvidia_hooks' must be \"warn\" or \"fail\", not 'ignore'"),
    ],
)
def test_bad_config_names_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as err:
        load_config(str(path), required=True)
    assert str(path) in err.value.message


def test_the_example_config_shows_every_key_commented_out_at_its_default(tmp_path: Path) -> None:
    """config/config.toml (the Debian package's conffile) as installed means the defaults, and each key
    uncommented, as an operator would, still does; the named tables' examples load too."""
    from ponytail.config import schema

    text = (Path(__file__).resolve().parents[2] / "config" / "config.toml").read_text()
    plain, intro, named = text.partition("\n# [capabilities.NAME]")
    named = intro + named
    keys = re.findall(r"^#(\w+) = ", plain, re.M)
    assert len(keys) == len([k for k, *_ in schema() if ".NAME." not in k])
    uncommented = tmp_path / "uncommented.toml"
    uncommented.write_text(re.sub(r"^#(\w+ = )", r"\1", plain, flags=re.M))
    assert replace(load_config(str(uncommented), required=True), path=None) == Config()
    examples = tmp_path / "examples.toml"
    examples.write_text(re.sub(r"^#(\[[\w.-]+\]|\w+ = )", r"\1", named, flags=re.M))
    loaded = load_config(str(examples), required=True)
    assert loaded.capability_extras["compute"]["libraries"] == ("libnvidia-extra",) and "build-1234" in loaded.drivers
