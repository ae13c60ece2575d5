"""ponytail.lite.plainjson reads plain JSON as json.loads does, and leaves the rest to json.loads:
for any bytes, loads_plain returns json.loads' value or None, never another value."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ponytail.lite.plainjson import MAX_DEPTH, loads_plain


def json_or_error(raw: bytes) -> object:
    try:
        return ("ok", json.loads(raw))
    except (ValueError, RecursionError) as e:
        return ("error", type(e).__name__)


def agrees(raw: bytes) -> object:
    """loads_plain's answer, after checking that it is json.loads' value or None."""
    plain = loads_plain(raw)
    if plain is not None:
        expected = json_or_error(raw)
        assert expected == ("ok", plain), (raw, plain, expected)
        assert json.dumps(plain, sort_keys=True) == json.dumps(expected[1], sort_keys=True)  # type: ignore[index]
    return plain


CONFIG = {
    "ociVersion": "1.0.2",
    "process": {
        "terminal": False,
        "user": {"uid": 0, "gid": 0, "additionalGids": [0, 10]},
        "args": ["/bin/sh", "-c", 'echo "quoted" \\ back\tslash'],
        "env": ["PATH=/usr/local/sbin:/usr/bin", "NVIDIA_VISIBLE_DEVICES=0,1", "LANG=C.UTF-8", "NAME=żółw ☃ 𝄞"],
        "cwd": "/",
        "capabilities": {"bounding": ["CAP_CHOWN", "CAP_SYS_ADMIN"], "effective": []},
        "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1048576, "soft": 1048576}],
        "noNewPrivileges": True,
        "oomScoreAdj": -999,
    },
    "root": {"path": "rootfs", "readonly": False},
    "hostname": "gpu",
    "mounts": [{"destination": "/proc", "type": "proc", "source": "proc", "options": None}],
    "hooks": {"prestart": [{"path": "/usr/bin/ponytail", "args": ["ponytail"], "timeout": 30}]},
    "annotations": {"io.kubernetes.cri.sandbox-id": "abc", "empty": ""},
    "linux": {
        "cgroupsPath": "/ponytail/test",
        "resources": {"devices": [{"allow": False, "access": "rwm"}, {"allow": True, "type": "c", "major": 195, "minor": 255}]},
        "devices": [],
        "maskedPaths": ["/proc/kcore"],
    },
}


@pytest.mark.parametrize("dump", [
    lambda v: json.dumps(v),
    lambda v: json.dumps(v, indent=2),
    lambda v: json.dumps(v, indent="\t", ensure_ascii=False),
    lambda v: json.dumps(v, separators=(",", ":")),
    lambda v: " \r\n" + json.dumps(v, indent=1) + "\n\n",
])
def test_what_engines_write_is_plain(dump) -> None:
    raw = dump(CONFIG).encode()
    assert agrees(raw) == CONFIG


def test_the_state_and_config_an_engine_writes_are_plain(tmp_path: Path) -> None:
    runc = shutil.which("runc")
    if runc is None:
        pytest.skip("runc is not installed")
    subprocess.run([runc, "spec", "--bundle", str(tmp_path)], check=True)
    raw = (tmp_path / "config.json").read_bytes()
    assert agrees(raw) == json.loads(raw)


@pytest.mark.parametrize("raw", [
    b"", b" ", b"{", b"}", b"{}x", b"{} {}", b'{"a":1,}', b"[1,]", b'{"a" 1}', b"{'a':1}", b'{"a":01}',
    b'{"a":-}', b'{"a":--1}', b'{"a":+1}', b'{"a":1.5}', b'{"a":1e3}', b'{"a":-0}', b'{"a":NaN}',
    b'{"a":Infinity}', b'{"a":-Infinity}', b'{"a":tru}', b'{"a":True}', b'{"a":nul}', b'{"a":"\x01"}',
    b'{"a":"\x7f"}', b'{"a":"\\x41"}', b'{"a":"\\u00e9\\u20ac"}', b'{"a":"\\ud83d\\ude00"}', b'{"a":"\\ud800"}',
    b'{"a":"\\u12"}', b'{"a":"\\u12G4"}', b'{"a":"\\"\\\\\\/\\b\\f\\n\\r\\t"}', b'{"a":"unterminated}',
    b'{"a":"\\', b'\xef\xbb\xbf{"a":1}', b'{"a":"\xff"}', b'{"a":"\xed\xa0\x80"}', b'{\x00}\x00',
    b'{"a":1}\x00', b'"top"', b"[]", b"null", b"12", b'{"a":{"b":[[],{}]}}', b'{"a":1,"a":2}',
    b'{"a":"' + b"9" * 5000 + b'"}', b'{"a":' + b"9" * 5000 + b"}", b'{"a":' + b"9" * 4000 + b"}",
    b"[" * MAX_DEPTH + b"]" * MAX_DEPTH, b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1),
    b"[" * 100000, b'{"a":1}\n', b"\n\t{ \"a\" : [ 1 , 2 ] }\r\n", b'{"a":"\xe2\x80\xa8\xc2\xa0"}',
])
def test_edge_cases_are_json_loads_or_none(raw: bytes) -> None:
    agrees(raw)


def test_what_is_outside_the_subset_is_left_to_json() -> None:
    from ponytail.lite.plainjson import MAX_PLAIN_BYTES

    big = json.dumps({"env": ["X=" + "y" * 100] * (MAX_PLAIN_BYTES // 100)}).encode()  # json's C scanner is faster there
    assert len(big) > MAX_PLAIN_BYTES and loads_plain(big) is None and json.loads(big)
    assert loads_plain(json.dumps({"env": ["X=y"] * 100}).encode()) is not None
    for raw in (b'{"a":1.5}', b'{"a":"\\ud800"}', b'\xef\xbb\xbf{}', b'{"a":"\x01"}', b"[" * 65 + b"]" * 65):
        assert loads_plain(raw) is None
    assert loads_plain(b'{"a":"\\ud83d\\ude00\\u00e9"}') == {"a": "\U0001f600\u00e9"}  # a pair is plain


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True) | st.text(),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=30,
)
@given(value=json_values, indent=st.sampled_from([None, 0, 2, "\t"]), ascii_only=st.booleans())
def test_generated_documents_agree(value: object, indent: object, ascii_only: bool) -> None:
    agrees(json.dumps(value, indent=indent, ensure_ascii=ascii_only).encode())  # type: ignore[arg-type]
@given(value=json_values, data=st.data())
def test_damaged_documents_agree(value: object, data: st.DataObject) -> None:
    raw = bytearray(json.dumps({"k": value}).encode())
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(raw)))
        what = data.draw(st.sampled_from(["insert", "delete", "replace", "truncate"]))
        byte = data.draw(st.sampled_from(list(b'{}[]",:\\ -0123.eEuntfl\x00\x1f\x7f\xff\xed')))
        if what == "insert":
            raw[at:at] = bytes([byte])
        elif what == "delete":
            del raw[at:at + 1]
        elif what == "replace" and at < len(raw):
            raw[at] = byte
        else:
            del raw[at:]
    agrees(bytes(raw))
@given(raw=st.binary(max_size=64))
def test_arbitrary_bytes_agree(raw: bytes) -> None:
    agrees(raw)


# -- dumps: byte for byte json.dumps, or json.dumps itself -----------------------------------

plain_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.tuples(children, children)
    | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=25,
)
@given(value=plain_values, indent=st.sampled_from([None, 0, 1, 2, 4]))
def test_plain_values_are_written_as_json_dumps_writes_them(value: object, indent: int | None) -> None:
    from ponytail.lite.plainjson import dumps, dumps_plain

    assert dumps_plain(value, indent) == json.dumps(value, indent=indent)
    assert dumps(value, indent) == json.dumps(value, indent=indent)


@pytest.mark.parametrize("value", [
    1.5, float("nan"), {"a": [1, 2.0]}, {1: "int key"}, {None: 1}, {("t",): 1}, object(), [set()],
    True, type("Str", (str,), {})("sub"),
])
def test_anything_else_is_left_to_json_dumps(value: object) -> None:
    from ponytail.lite.plainjson import dumps, dumps_plain

    if isinstance(value, str) or value is True:  # a str subclass or a bool: plain, and what json writes
        assert dumps(value, 2) == json.dumps(value, indent=2)
        return
    assert dumps_plain(value, 2) is None
    try:
        expected = json.dumps(value, indent=2)
    except (TypeError, ValueError) as e:
        with pytest.raises(type(e)):
            dumps(value, 2)
    else:
        assert dumps(value, 2) == expected



KiB = 1 << 10
WORST_CASES = {  # larger than MAX_PLAIN_BYTES (lifted for the test), so that a rescan shows
    # an image's ENV full of "<", as Go writes it: the old reader rescanned to the string's end per escape
    "unicode-escapes": b'{"env": ["A=' + b"\\u003c" * (2048 * KiB // 6) + b'"]}',
    "escaped-quotes": b'"' + b'\\"' * (256 * KiB) + b'"',
    "short-strings": b"[" + b",".join([b'"\\n"'] * (100 * KiB)) + b"]",
    "integers": b"[" + b",".join([b"1234567"] * (64 * KiB)) + b"]",
    "nested": b'{"a": ' * 60 + b"[" + b",".join([b"{}"] * (170 * KiB)) + b"]" + b"}" * 60,
}


@pytest.mark.parametrize("name", WORST_CASES)
def test_worst_cases_take_time_in_proportion_to_json(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Linear: held to json's own pure-Python decoder on documents of 0.5-2 MiB."""
    import json.decoder
    import json.scanner

    from ponytail.lite import plainjson

    from support.timing import assert_as_fast

    monkeypatch.setattr(plainjson, "MAX_PLAIN_BYTES", 4 << 20)
    reference = json.JSONDecoder()
    reference.parse_string = json.decoder.py_scanstring  # type: ignore[attr-defined]
    reference.scan_once = json.scanner.py_make_scanner(reference)  # type: ignore[attr-defined]
    raw = WORST_CASES[name]
    text = raw.decode()
    assert plainjson.loads_plain(raw) == reference.decode(text) == json.loads(raw)
    assert_as_fast(lambda: plainjson.loads_plain(raw), lambda: reference.decode(text), name)
