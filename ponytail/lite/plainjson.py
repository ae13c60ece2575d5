"""Plain JSON: the subset of JSON that OCI states and config.json files are written in, read
without importing ``json`` (whose decoder imports ``re`` and ``enum``: most of a hook run's
import time once nothing else needs them), and written the same way (``ponytail info --json``,
``ponytail cdi generate``).

``loads_plain`` reads objects, arrays, strings (every escape but a lone surrogate ``\\uD8xx``),
integers, ``true``, ``false`` and ``null``, nested at most ``MAX_DEPTH`` deep, documents up to
``MAX_PLAIN_BYTES``. Anything else (a fraction or an exponent, a control character or a lone
surrogate in a string, deeper nesting, a larger document, invalid UTF-8, or any syntax error)
returns None: the caller then reads the same bytes with ``json.loads``, which also words the
error. So the result is always what ``json.loads`` would return, or None.

``dumps_plain`` writes dicts with string keys, lists, tuples, strings, integers, booleans and
None byte for byte as ``json.dumps(value, indent=...)`` does (ASCII only, ``\\uXXXX`` escapes);
anything else (a float, another key type or object) returns None, and ``dumps`` hands it to
``json.dumps``.

Held to ``json.loads`` and ``json.dumps`` by tests/unit/test_plainjson.py."""

from __future__ import annotations

MAX_DEPTH = 64
# Larger documents go to json: its C scanner reads them faster than importing it costs (a typical
# config.json is 5-20 KiB), and a hostile one cannot make a start slow through this reader.
MAX_PLAIN_BYTES = 64 << 10
_SPACE = " \t\n\r"
_DIGITS = "0123456789"
_NUMBER_CHARS = "-0123456789"
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_HEX = "0123456789abcdefABCDEF"


class _NotPlain(Exception):
    """Outside the subset (or not JSON): json.loads decides."""


def loads_plain(raw: bytes) -> object | None:
    """``json.loads(raw)`` for plain JSON; None when ``raw`` is anything else (or larger
    than MAX_PLAIN_BYTES)."""
    if len(raw) > MAX_PLAIN_BYTES:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if text.startswith("\ufeff"):  # json.loads refuses a byte-order mark in a str, not in bytes
        return None
    try:
        i = _skip_space(text, 0)
        value, i = _value(text, i, 0)
        i = _skip_space(text, i)
    except (_NotPlain, IndexError, ValueError):
        return None
    return value if i == len(text) else None


def _skip_space(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in _SPACE:
        i += 1
    return i


def _value(text: str, i: int, depth: int) -> tuple[object, int]:
    c = text[i]
    if c == '"':
        return _string(text, i + 1)
    if c == "{":
        return _object(text, i + 1, depth + 1)
    if c == "[":
        return _array(text, i + 1, depth + 1)
    if c in _NUMBER_CHARS:
        return _integer(text, i)
    if text.startswith("true", i):
        return True, i + 4
    if text.startswith("false", i):
        return False, i + 5
    if text.startswith("null", i):
        return None, i + 4
    raise _NotPlain


def _object(text: str, i: int, depth: int) -> tuple[dict[str, object], int]:
    if depth > MAX_DEPTH:
        raise _NotPlain
    result: dict[str, object] = {}
    i = _skip_space(text, i)
    if text[i] == "}":
        return result, i + 1
    while True:
        if text[i] != '"':
            raise _NotPlain
        key, i = _string(text, i + 1)
        i = _skip_space(text, i)
        if text[i] != ":":
            raise _NotPlain
        value, i = _value(text, _skip_space(text, i + 1), depth)
        result[key] = value
        done, i = _after_item(text, i, "}")
        if done:
            return result, i


def _array(text: str, i: int, depth: int) -> tuple[list[object], int]:
    if depth > MAX_DEPTH:
        raise _NotPlain
    result: list[object] = []
    i = _skip_space(text, i)
    if text[i] == "]":
        return result, i + 1
    while True:
        value, i = _value(text, i, depth)
        result.append(value)
        done, i = _after_item(text, i, "]")
        if done:
            return result, i


def _after_item(text: str, i: int, close: str) -> tuple[bool, int]:
    """After an object's or array's item: (True, past ``close``), or (False, the next item)."""
    i = _skip_space(text, i)
    c = text[i]
    if c == close:
        return True, i + 1
    if c != ",":
        raise _NotPlain
    return False, _skip_space(text, i + 1)


def _string(text: str, i: int) -> tuple[str, int]:
    """The string whose first character is at ``i`` (after the opening quote).

    Linear in the string's length however many escapes it has: each search for a backslash
    stops at the next one (or at the closing quote), and the closing quote is searched for
    again only when the one found was escaped."""
    end = text.index('"', i)
    backslash = text.find("\\", i, end)
    if backslash < 0:
        chunk = text[i:end]
        _check_chunk(chunk)
        return chunk, end + 1
    parts: list[str] = []
    while backslash >= 0:
        chunk = text[i:backslash]
        _check_chunk(chunk)
        parts.append(chunk)
        i = _escape(text, backslash + 1, parts)
        if end < i:  # the quote found was an escaped one
            end = text.index('"', i)
        backslash = text.find("\\", i, end)
    chunk = text[i:end]
    _check_chunk(chunk)
    parts.append(chunk)
    return "".join(parts), end + 1


def _escape(text: str, i: int, parts: list[str]) -> int:
    """Append the character of the escape whose letter is at ``i``; the index past it."""
    c = text[i]
    if c != "u":
        escaped = _ESCAPES.get(c)
        if escaped is None:
            raise _NotPlain
        parts.append(escaped)
        return i + 1
    digits = text[i + 1 : i + 5]
    if len(digits) != 4 or any(d not in _HEX for d in digits):
        raise _NotPlain
    code = int(digits, 16)
    i += 5
    if 0xD800 <= code <= 0xDBFF and text.startswith("\\u", i):  # a surrogate pair: one character
        low = text[i + 2 : i + 6]
        if len(low) == 4 and all(d in _HEX for d in low) and 0xDC00 <= int(low, 16) <= 0xDFFF:
            code = 0x10000 + ((code - 0xD800) << 10) + (int(low, 16) - 0xDC00)
            i += 6
    if 0xD800 <= code <= 0xDFFF:  # a lone surrogate is no text: json.loads keeps it, the caller refuses it
        raise _NotPlain
    parts.append(chr(code))
    return i


def _check_chunk(chunk: str) -> None:
    """A raw control character is not JSON; a lone surrogate cannot come from valid UTF-8."""
    if not chunk.isprintable() and any(ord(c) < 0x20 for c in chunk):
        raise _NotPlain


def _integer(text: str, i: int) -> tuple[int, int]:
    start = i
    n = len(text)
    if text[i] == "-":
        i += 1
    digits_start = i
    while i < n and text[i] in _DIGITS:
        i += 1
    digits = text[digits_start:i]
    if not digits or (len(digits) > 1 and digits[0] == "0"):
        raise _NotPlain
    if i < n and text[i] in ".eE":  # a fraction or an exponent: json.loads makes the float
        raise _NotPlain
    if len(digits) > 4000:  # int()'s digit limit: json.loads words it
        raise _NotPlain
    return int(text[start:i]), i


def loads(raw: bytes | str) -> object:
    """``json.loads(raw)``, importing ``json`` only when ``raw`` is not plain JSON."""
    value = loads_plain(raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw)
    if value is None:
        import json

        return json.loads(raw)
    return value


def dumps(value: object, indent: int | None = None) -> str:
    """``json.dumps(value, indent=indent)``, importing ``json`` only for what ``dumps_plain``
    leaves to it."""
    text = dumps_plain(value, indent)
    if text is None:
        import json

        return json.dumps(value, indent=indent)
    return text


def dumps_plain(value: object, indent: int | None = None) -> str | None:
    """``json.dumps(value, indent=indent)`` for plain values; None for anything else."""
    parts: list[str] = []
    try:
        _dump(value, parts, "\n" if indent is not None else None, " " * (indent or 0), 0)
    except _NotPlain:
        return None
    return "".join(parts)


def _dump(value: object, parts: list[str], newline: str | None, step: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise _NotPlain
    if isinstance(value, str):
        parts.append(_quoted(value))
    elif value is None:
        parts.append("null")
    elif value is True:
        parts.append("true")
    elif value is False:
        parts.append("false")
    elif type(value) is int:
        parts.append(int.__repr__(value))
    elif type(value) is dict:
        if not value:
            parts.append("{}")
            return
        inner = newline + step * (depth + 1) if newline is not None else None
        parts.append("{")
        for i, (key, item) in enumerate(value.items()):
            if type(key) is not str:
                raise _NotPlain  # json.dumps converts or refuses other keys
            parts.append(("," if i else "") + (inner if inner is not None else (" " if i else "")))
            parts.append(_quoted(key) + ": ")
            _dump(item, parts, newline, step, depth + 1)
        parts.append(newline + step * depth + "}" if newline is not None else "}")
    elif type(value) in (list, tuple):
        items: list | tuple = value  # type: ignore[assignment]
        if not items:
            parts.append("[]")
            return
        inner = newline + step * (depth + 1) if newline is not None else None
        parts.append("[")
        for i, item in enumerate(items):
            parts.append(("," if i else "") + (inner if inner is not None else (" " if i else "")))
            _dump(item, parts, newline, step, depth + 1)
        parts.append(newline + step * depth + "]" if newline is not None else "]")
    else:
        raise _NotPlain  # floats, subclasses, other objects: json.dumps decides


_ESCAPED = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def _quoted(text: str) -> str:
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    out = []
    for c in text:
        code = ord(c)
        if c in _ESCAPED:
            out.append(_ESCAPED[c])
        elif 0x20 <= code < 0x7F:
            out.append(c)
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            code -= 0x10000
            out.append(f"\\u{0xD800 | (code >> 10):04x}\\u{0xDC00 | (code & 0x3FF):04x}")
    return '"' + "".join(out) + '"'
