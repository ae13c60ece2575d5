"""A spec's kind and hooks, skimmed (ponytail.cdi.skim) for the owner check: the same as the whole
parse for what nvidia-ctk 1.20.0 wrote (captured in ../shared/nvidia) and what ponytail writes, in
YAML and JSON; None (the whole parse then) for any form it does not read, never another answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ponytail.cdi.files import render
from ponytail.cdi.owners import scan
from ponytail.cdi.skim import skim, spec_hooks

from support.nvidia_tools import PLACEHOLDER, SPECS

CAPTURED = sorted(p.name for p in SPECS.glob("*.yaml")) + sorted(p.name for p in SPECS.glob("*-default.json"))


def whole(raw: bytes, json_form: bool) -> tuple[str, tuple]:
    spec = json.loads(raw) if json_form else yaml.safe_load(raw)
    return spec["kind"], tuple(spec_hooks(spec))


def captured(name: str) -> bytes:
    return (SPECS / name).read_bytes().replace(PLACEHOLDER.encode(), b"/host-root")


@pytest.mark.parametrize("name", CAPTURED)
def test_nvidia_ctks_specs_are_skimmed_as_parsed_whole(name: str) -> None:
    raw = captured(name)
    json_form = name.endswith(".json")
    kind, hooks = whole(raw, json_form)
    assert skim(raw, json_form) == (kind, hooks) and hooks  # their hooks are NVIDIA's: the generator is told by them
    spec = json.loads(raw) if json_form else yaml.safe_load(raw)
    for form in ("yaml", "json"):  # the same spec as ponytail writes it, and JSON compact and indented
        text = render(spec, form)
        assert skim(text, form == "json") == (kind, hooks), form
    assert skim(json.dumps(spec, indent=4).encode(), True) == (kind, hooks)


def test_a_spec_is_scanned_alike_skimmed_or_whole(tmp_path: Path) -> None:
    for name in CAPTURED:
        (tmp_path / name).write_bytes(captured(name))
    (tmp_path / "ponytail.yaml").write_bytes(render(_spec("nvidia.com/gpu", [("/usr/bin/ponytail", ["ponytail", "cdi-hook", "--gpu", "0", "0000:1c:00.0"])]), "yaml"))
    (tmp_path / "broken.yaml").write_text("kind: nvidia.com/gpu\ndevices: [\n")
    skimmed, parsed = scan("/", (str(tmp_path),), whole=False), scan("/", (str(tmp_path),))
    assert [(f.path, f.kind, f.generator, f.hooks) for f in skimmed] == [(f.path, f.kind, f.generator, f.hooks) for f in parsed]
    assert {f.generator for f in skimmed} == {"nvidia-ctk", "ponytail", "another generator"} and all(f.spec is None for f in skimmed)
    assert all(f.spec is not None for f in parsed if not f.path.endswith("broken.yaml"))


OUTSIDE = {  # forms the skim leaves to the whole parse
    "flow": "{cdiVersion: 0.5.0, kind: nvidia.com/gpu, devices: []}\n",
    "flow hooks": "kind: a.com/b\ncontainerEdits:\n  hooks: [{path: /x, args: [x]}]\n",
    "alias": "kind: a.com/b\nbase: &e\n  hooks:\n  - path: /x\ncontainerEdits: *e\n",
    "tag": "kind: !!str a.com/b\n",
    "two lines": "kind: a.com/b\ncontainerEdits:\n  hooks:\n  - path: /usr/bin/x\n    args:\n    - x\n    - a long\n      argument\n",
    "a number": "kind: a.com/b\ncontainerEdits:\n  hooks:\n  - path: /x\n    args:\n    - x\n    - 0755\n",
    "a boolean": "kind: a.com/b\ncontainerEdits:\n  hooks:\n  - path: /x\n    args:\n    - yes\n",
    "a float": "kind: 1.5\n",
    "kind twice": "kind: a.com/b\nkind: c.com/d\n",
    "escape": 'kind: "a.com/\\x62"\n',
    "tab": "kind: a.com/b\ncontainerEdits:\n\thooks: []\n",
    "no kind": "cdiVersion: 0.5.0\n",
    "two documents": "kind: a.com/b\n---\nkind: c.com/d\n",
    "block scalar": "kind: |\n  a.com/b\n",
    "indented": "  kind: a.com/b\n",
    "merge": "kind: a.com/b\ndevices:\n- name: '0'\n  <<: *e\n",
    "merged block": "kind: a.com/b\n<<:\n  containerEdits:\n    hooks:\n    - path: /usr/bin/nvidia-cdi-hook\n      args: [x]\n",
    "next line": "kind: a.com/x\ncdiVersion: 0.6.0\x85kind: nvidia.com/gpu\n",
    "line separator": "kind: a.com/x\ncdiVersion: 0.6.0\u2028kind: nvidia.com/gpu\n",
    "paragraph separator": "kind: a.com/x\ncdiVersion: 0.6.0\u2029kind: nvidia.com/gpu\n",
}


@pytest.mark.parametrize("name", sorted(OUTSIDE))
def test_other_yaml_forms_are_left_to_the_whole_parse(name: str) -> None:
    assert skim(OUTSIDE[name].encode(), False) is None


@pytest.mark.parametrize("text", [
    '{"kind": "a.com/b", "containerEdits": {"hooks": [{"path": "/x", "args": ["a\\u0026b"]}]}}',  # Go's escape of &
    '{"kind": "a.com/b", "kind": "c.com/d"}',
    '["kind", "a.com/b"]',
    '{"kind": "a.com/b"} {}',
    '{"kind": "a.com/b", "devices": [{"name": "0"]}',
])
def test_other_json_forms_are_left_to_the_whole_parse(text: str) -> None:
    assert skim(text.encode(), True) is None


def test_what_is_stepped_over_may_be_written_in_other_forms() -> None:
    text = """kind: a.com/b # the kind
devices:
- name: "0"
  note: |
    kind: not.this/one
    hooks:
  count: 3
  flag: yes
containerEdits:
  env:
  - A=1
  - 'B: 2'
  hooks:
  - path: '/usr/bin/it''s'
    args:
    - it
    - 550.54.15
    - 0000:1c:00.0
    - --link
"""
    expected = ("a.com/b", (("/usr/bin/it's", ("it", "550.54.15", "0000:1c:00.0", "--link")),))
    assert skim(text.encode(), False) == whole(text.encode(), False) == expected
    data = '{"kind":"a.com/b","devices":[{"name":"x]}{[","containerEdits":{"hooks":[{"path":"/h","args":["h"]}]}}],\n "n": [1, -2.5e3, true, null]}'
    assert skim(data.encode(), True) == whole(data.encode(), True) == ("a.com/b", (("/h", ("h",)),))


def _spec(kind: str, hooks: list[tuple[str, list[str]]], device_hooks: list[tuple[str, list[str]]] = ()) -> dict:  # type: ignore[assignment]
    entries = [{"hookName": "createContainer", "path": p, "args": a} for p, a in hooks]
    device = {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}],
                                              "hooks": [{"hookName": "createContainer", "path": p, "args": a} for p, a in device_hooks]}}
    return {"cdiVersion": "0.5.0", "kind": kind, "devices": [device, {"name": "all", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}],
            "containerEdits": {"env": ["A=1"], "hooks": entries, "mounts": [{"hostPath": "/a", "containerPath": "/a", "options": ["ro"]}]}}


_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_HOOK = st.tuples(_TEXT, st.lists(_TEXT, max_size=5))


@settings(max_examples=300, deadline=None)
@given(kind=_TEXT, hooks=st.lists(_HOOK, max_size=3), device_hooks=st.lists(_HOOK, max_size=2))
def test_any_spec_is_skimmed_as_parsed_whole_or_left_to_it(kind: str, hooks: list, device_hooks: list) -> None:
    spec = _spec(kind, hooks, device_hooks)
    for form in ("yaml", "json"):
        raw = render(spec, form)
        found = skim(raw, form == "json")
        assert found is None or found == whole(raw, form == "json"), raw.decode()


_PLAIN = st.text(alphabet="ghkmsuvwz/.-_", min_size=1, max_size=12).map(lambda text: "g" + text)  # strings to YAML in any order


@settings(max_examples=200, deadline=None)
@given(kind=_PLAIN, hooks=st.lists(st.tuples(_PLAIN, st.lists(_PLAIN, max_size=5)), max_size=3))
def test_ponytails_own_specs_are_always_skimmed(kind: str, hooks: list) -> None:
    spec = _spec(kind, hooks)
    for form in ("yaml", "json"):
        raw = render(spec, form)
        assert skim(raw, form == "json") == whole(raw, form == "json"), raw.decode()
