"""ponytail.lite.plaintoml reads plain configs as tomllib does, and leaves the rest to tomllib."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ponytail.lite.plaintoml import loads_plain

from support.fakehost import FakeHost, gpus

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.root
def test_the_shipped_config_and_the_test_configs_are_plain(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "h", gpu_list=gpus(1))
    texts = [
        (REPO / "config/config.toml").read_text(),
        host.write_config(library_paths=["/usr/lib/x86_64-linux-gnu/libcuda.so.*"]).read_text(),
    ]
    for text in texts:
        assert loads_plain(text) == tomllib.loads(text)
        assert loads_plain(text) is not None


@pytest.mark.parametrize(
    "text",
    [
        "[host]\r\nldconfig = ''  # empty\r\n[library]\npaths = [\n  # the driver\n  '/a/*',\n  \"/b\", ]\n",
        "[ log ]\nfile='/x/\"quoted\"\\\\not an escape'\n\n\n[host]\nretries = -3\nverbose = false\nzero = +0\n",
        "# only a comment",
        "",
        '[t]\nkey = "ünïcødé"\n',
        '[drivers.build-1]\nroot = "/opt/umd/1"\n[host]\nx = 1\n[drivers.b2]\nroot = "/opt/umd/2"\n',  # two-part headers
    ],
)
def test_plain_text_reads_as_tomllib_reads_it(text: str) -> None:
    assert loads_plain(text) == tomllib.loads(text)


@pytest.mark.parametrize(
    "text",
    [
        'top = "level"\n',  # a key outside any table
        '[a.b.c]\nk = "v"\n',  # a table header of three parts
        '[a]\n[a.b]\n',  # a table named alone and as a header's first part
        '[[a]]\nk = "v"\n',  # array of tables
        '[a]\nb.c = "v"\n',  # dotted key
        '[a]\n"quoted" = "v"\n',  # quoted key
        '[a]\nk = "tab\\tescape"\n',  # escape
        '[a]\nk = """multi\nline"""\n',  # multi-line string
        "[a]\nk = 1.5\n",  # float
        "[a]\nk = 1_000\n",  # underscore
        "[a]\nk = 0x1f\n",  # hex
        "[a]\nk = 1979-05-27\n",  # date
        "[a]\nk = { x = 1 }\n",  # inline table
        "[a]\nk = [1, 2]\n",  # array of numbers
        '[a]\nk = [["nested"]]\n',  # nested array
    ],
)
def test_anything_else_is_left_to_tomllib(text: str) -> None:
    tomllib.loads(text)  # valid TOML, just not plain
    assert loads_plain(text) is None


@pytest.mark.parametrize(
    "text",
    [
        '[a]\nk = "v"\nk = "w"\n',  # repeated key
        '[a]\n[a]\n',  # repeated table
        '[a]\nk = "v" junk\n',
        '[a]\nk = "unterminated\n',
        '[a]\nk = ["a" "b"]\n',
        '[a]\nk = ["a",\n',
        "[a]\nk = 01\n",
        "[a]\nk =\n",
        "[a]\nk = truex\n",
        "[a] # comment with a \x01 control\n",
        '[a]\nk = "bell \x07"\n',
        "[a]\r k = 1\n",
        "[a\n",
    ],
)
def test_invalid_toml_is_left_to_tomllib_for_its_error(text: str) -> None:
    with pytest.raises(tomllib.TOMLDecodeError):
        tomllib.loads(text)
    assert loads_plain(text) is None


KEY = st.text("abcXYZ09_-", min_size=1, max_size=6)
STRING = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
VALUE = st.one_of(
    STRING.map(lambda s: f'"{s}"'),
    STRING.map(lambda s: f"'{s}'"),
    st.integers(-(10**6), 10**6).map(str),
    st.sampled_from(["true", "false", "[]"]),
    st.lists(STRING.map(lambda s: f"'{s}'"), max_size=3).map(lambda xs: "[\n  " + ",\n  ".join(xs) + ",\n]"),
)
LINE = st.one_of(
    KEY.map(lambda k: f"[{k}]"),
    st.tuples(KEY, KEY).map(lambda ks: f"[{ks[0]}.{ks[1]}]"),
    st.tuples(KEY, VALUE).map(lambda kv: f"{kv[0]} = {kv[1]}"),
    STRING.map(lambda s: f"# {s}"),
    st.just(""),
)
@given(st.lists(LINE, max_size=12), st.sampled_from(["\n", "\r\n"]))
def test_whatever_it_reads_tomllib_reads_the_same(lines: list[str], newline: str) -> None:
    text = newline.join(lines)
    plain = loads_plain(text)
    try:
        expected = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        assert plain is None, text
        return
    assert plain is None or plain == expected, text
@given(st.text(alphabet=st.sampled_from(list("[]=\"' \t\n\r#,.abc01-+\\\x00\x7fé")), max_size=40))
def test_on_garbage_it_agrees_with_tomllib_or_gives_up(text: str) -> None:
    plain = loads_plain(text)
    try:
        expected = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        assert plain is None, repr(text)
        return
    assert plain is None or plain == expected, repr(text)


def test_an_integer_longer_than_int_converts_is_left_to_tomllib() -> None:
    text = "[a]\nk = " + "1" * 4301 + "\n"
    with pytest.raises(ValueError):  # not a TOMLDecodeError: ponytail.config words it (tests/integration/test_bad_input.py)
        tomllib.loads(text)
    assert loads_plain(text) is None
    assert loads_plain("[a]\nk = " + "1" * 4000 + "\n") == tomllib.loads("[a]\nk = " + "1" * 4000 + "\n")


KiB = 1 << 10
WORST_CASES = {  # each about 256 KiB (a config may have 1 MiB)
    "long-string": '[a]\nk = "' + "a" * (256 * KiB) + '"\n',
    "long-comment": "#" + "x" * (256 * KiB) + "\n",
    "array": "[a]\nk = [" + ",".join(['"a"'] * (64 * KiB)) + "]\n",
    "keys": "[a]\n" + "".join(f"k{i} = 1\n" for i in range(24 * KiB)),
    "tables": "".join(f"[t.k{i}]\n" for i in range(24 * KiB)),
    "blank-lines": "\n" * (256 * KiB),
    "spaces": "[a]\nk =" + " " * (256 * KiB) + "1\n",
}


@pytest.mark.parametrize("name", WORST_CASES)
def test_worst_cases_take_time_in_proportion_to_tomllib(name: str) -> None:
    from support.timing import assert_as_fast

    text = WORST_CASES[name]
    assert loads_plain(text) == tomllib.loads(text)
    assert_as_fast(lambda: loads_plain(text), lambda: tomllib.loads(text), name)
