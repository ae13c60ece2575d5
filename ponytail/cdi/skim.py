"""A CDI spec's kind and hooks, read without parsing the rest.

The owner check of ``ponytail cdi generate`` (ponytail.cdi.owners) reads every spec in the
engines' spec directories for two things: its ``kind``, and its hooks, which tell the tool that
wrote it. An 18-GPU spec is 20-40 KiB, nearly all of it device entries. ``skim`` reads the two
things and steps over the rest by indentation (YAML) or by brackets (JSON). It reads what the
generators write:

- YAML in block style: nvidia-ctk, NVIDIA's device plugin and DRA driver (all go-yaml, four
  spaces, the items of a list indented) and ponytail (PyYAML, two spaces, items not indented);
- JSON, compact (nvidia-ctk) or indented (ponytail).

Where a value it wants is written in a form outside that (flow style, an anchor or alias, a tag,
a scalar on several lines, an escape, a plain scalar that YAML reads as a number, a boolean or
null), or the file's shape is not a block mapping or a JSON object, ``skim`` answers None and
the caller parses the file whole (ponytail.cdi.files.read_spec). It checks no more than it
reads: a file the whole parse refuses may still be skimmed, and then its kind and hooks are
those its text names (what the owner check reads from such a file anyway).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    Lines = list[tuple[int, str]]  # (indent, text) of each line that is not blank or a comment
    Handler = Callable[[Lines, int, int, str], int]  # (lines, index of a key's line, its indent, the rest) -> the index after
    Item = Callable[[Lines, int, int], int]  # (lines, index of an item's first line, its column) -> the index after

Hook = tuple[str, tuple[str, ...]]  # a hook's path and args
Skimmed = tuple[str, tuple[Hook, ...]]  # the kind; the hooks, the spec's own first, then each device's, in order
MAX_BYTES = 16 << 20  # as read_spec reads
_INDICATORS = "[]{}#&*!|>'\"%@`,?:"  # a plain YAML scalar or key starting with one of these: the whole parse
_NOT_STRINGS = frozenset(("", "~", "null", "true", "false", "yes", "no", "on", "off", "y", "n", "=", "<<"))
_SPACE = " \t\n\r"
_DIGITS = "0123456789"
_NUMBER_CHARS = _DIGITS + "_.:+- eExXbBoOabcdefABCDEFinfINFNaTtZ"  # all that YAML 1.1 numbers and dates are made of


class _Outside(Exception):
    """Not what the skim reads: parse the file whole."""


def skim_file(path: str) -> Skimmed | None:
    """The kind and hooks of the spec file ``path`` (JSON for a .json, else YAML, as read_spec
    reads them); None where the file cannot be read or is not written in the forms skimmed."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES)
    except OSError:
        return None
    return skim(raw, path.endswith(".json"))


def skim(raw: bytes, json_form: bool) -> Skimmed | None:
    """The kind and hooks of a spec's text; None where it is not written in the forms skimmed."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    try:
        return _json(text) if json_form else _yaml(text)
    except (_Outside, IndexError):
        return None


def spec_hooks(spec: dict) -> list[Hook]:
    """The hooks of a parsed spec, as ``skim`` lists them."""
    edits = [spec.get("containerEdits") or {}] + [d.get("containerEdits") or {} for d in spec.get("devices") or [] if isinstance(d, dict)]
    hooks = [h for e in edits if isinstance(e, dict) for h in e.get("hooks") or [] if isinstance(h, dict)]
    return [(str(h.get("path", "")), tuple(str(a) for a in h.get("args") or [])) for h in hooks]


# -- YAML, block style --------------------------------------------------------------------


def _yaml(text: str) -> Skimmed:
    if any(c in text for c in "\t\r\x85\u2028\u2029") or text.startswith("\ufeff"):  # YAML's other line breaks too
        raise _Outside
    lines = []
    for line in text.split("\n"):
        body = line.lstrip(" ")
        if body and body[0] != "#":
            lines.append((len(line) - len(body), body.rstrip(" ")))
    if lines and lines[0][1].startswith("%"):
        raise _Outside
    start = 1 if lines and lines[0] == (0, "---") else 0
    kind: list[str] = []
    own: list[Hook] = []
    devices: list[Hook] = []

    def take_kind(lines: Lines, i: int, n: int, rest: str) -> int:
        kind.append(_scalar(rest))
        return _one_line(lines, i, n)

    def device(lines: Lines, i: int, m: int) -> int:
        return _mapping(lines, i, m, {"containerEdits": lambda lines, i, n, rest: _edits(lines, i, n, rest, devices)})

    handlers = {"kind": take_kind, "containerEdits": lambda lines, i, n, rest: _edits(lines, i, n, rest, own),
                "devices": lambda lines, i, n, rest: _sequence(lines, i, n, rest, device)}
    if _mapping(lines, start, 0, handlers) != len(lines) or len(kind) != 1:
        raise _Outside
    return kind[0], (*own, *devices)


def _mapping(lines: Lines, i: int, m: int, handlers: dict[str, Handler]) -> int:
    """The block mapping whose keys are at indent ``m`` from ``lines[i]``; the index after it.
    A key in ``handlers`` is read by its handler, any other key's value is stepped over."""
    seen = set()
    while i < len(lines):
        n, body = lines[i]
        if n < m:
            return i
        if n > m:
            raise _Outside
        key, rest = _key(body)
        handler = handlers.get(key)
        if handler is None:
            i = _skip(lines, i, m, rest)
            continue
        if key in seen:  # the whole parse says what a key twice is
            raise _Outside
        seen.add(key)
        i = handler(lines, i, m, rest)
    return i


def _skip(lines: Lines, i: int, n: int, rest: str) -> int:
    """Step over the value of the key at ``lines[i]`` (indent ``n``): all the lines indented more,
    and the items of a list at its own indent (PyYAML's form)."""
    if rest:
        c = rest[0]
        if c in "[{":
            if rest not in ("[]", "{}"):
                raise _Outside
        elif c in "&*!?%@`":
            raise _Outside
        elif c in "\"'":
            _quoted(rest)  # on this line, else the whole parse
    i += 1
    end = len(lines)
    if rest:
        while i < end and lines[i][0] > n:
            i += 1
    else:
        while i < end and (lines[i][0] > n or (lines[i][0] == n and _is_item(lines[i][1]))):
            i += 1
    return i


def _sequence(lines: Lines, i: int, n: int, rest: str, item: Item) -> int:
    """The block list that is the value of the key at ``lines[i]`` (indent ``n``), each item read by
    ``item(lines, index, indent)`` from its first line (the text after '- ', at its own column)."""
    if rest == "[]":
        return _one_line(lines, i, n)
    if rest:
        raise _Outside
    i += 1
    if i >= len(lines) or lines[i][0] < n or not _is_item(lines[i][1]):
        if i < len(lines) and lines[i][0] > n:
            raise _Outside  # a mapping where a list belongs
        return i  # null: no items
    s = lines[i][0]
    while i < len(lines) and lines[i][0] == s and _is_item(lines[i][1]):
        body = lines[i][1]
        after = body[1:].lstrip(" ")
        if not after or after[0] == "#":
            raise _Outside  # the item on the next lines, or null
        column = s + len(body) - len(after)
        lines[i] = (column, after)
        i = item(lines, i, column)
    return i


def _edits(lines: Lines, i: int, n: int, rest: str, out: list[Hook]) -> int:
    """A containerEdits mapping: its hooks added to ``out``."""
    if rest == "{}":
        return _one_line(lines, i, n)
    if rest:
        raise _Outside

    def hook(lines: Lines, i: int, m: int) -> int:
        found: dict[str, object] = {}

        def path(lines: Lines, i: int, n: int, rest: str) -> int:
            found["path"] = _scalar(rest)
            return _one_line(lines, i, n)

        def args(lines: Lines, i: int, n: int, rest: str) -> int:
            values: list[str] = []

            def value(lines: Lines, i: int, column: int) -> int:
                values.append(_scalar(lines[i][1]))
                return _one_line(lines, i, column)

            found["args"] = values
            return _sequence(lines, i, n, rest, value)

        i = _mapping(lines, i, m, {"path": path, "args": args})
        out.append((str(found.get("path", "")), tuple(found.get("args", ()))))  # type: ignore[arg-type]
        return i

    i += 1
    if i < len(lines) and lines[i][0] > n:
        return _mapping(lines, i, lines[i][0], {"hooks": lambda lines, i, n, rest: _sequence(lines, i, n, rest, hook)})
    if i < len(lines) and lines[i][0] == n and _is_item(lines[i][1]):
        raise _Outside  # a list where a mapping belongs
    return i


def _one_line(lines: Lines, i: int, n: int) -> int:
    """The index after a value that must end on its own line (a scalar wanted, ``[]``)."""
    i += 1
    if i < len(lines) and lines[i][0] > n:
        raise _Outside  # a scalar on more lines
    return i


def _is_item(body: str) -> bool:
    return body == "-" or body.startswith("- ")


def _key(body: str) -> tuple[str, str]:
    """``key: rest`` or ``key:`` -> key, rest (a comment left out)."""
    if body[0] in "\"'":
        key, after = _quoted(body)
        if not after.startswith(":") or after[1:2] not in ("", " "):
            raise _Outside
        rest = after[1:].lstrip(" ")
    else:
        if body[0] in _INDICATORS or _is_item(body):
            raise _Outside
        colon = body.find(": ")
        if colon < 0:
            if not body.endswith(":"):
                raise _Outside
            key, rest = body[:-1], ""
        else:
            key, rest = body[:colon], body[colon + 2:].lstrip(" ")
        if "#" in key or key.endswith(" "):
            raise _Outside
    if key == "<<":  # a merge key: what it merges in is the whole parse's
        raise _Outside
    return key, ("" if rest.startswith("#") else rest)


def _scalar(rest: str) -> str:
    """A scalar that YAML reads as a string, whole on this line."""
    if not rest:
        raise _Outside
    if rest[0] in "\"'":
        value, after = _quoted(rest)
        if after and not after.startswith(" #") and after.strip(" "):
            raise _Outside
        return value
    if rest[0] in _INDICATORS or _is_item(rest):
        raise _Outside
    cut = rest.find(" #")
    value = rest if cut < 0 else rest[:cut].rstrip(" ")
    if ": " in value or value.endswith(":") or value.lower() in _NOT_STRINGS:
        raise _Outside
    head = value[1:] if value[0] in "+-" else value
    if head[:1] and head[0] in _DIGITS + "." and not _not_a_number(head):
        raise _Outside  # a number or a date to YAML, or perhaps one
    return value


def _not_a_number(head: str) -> bool:
    """Whether a plain scalar that starts with a digit or a dot is a string to YAML 1.1 (PyYAML's
    int, float and timestamp forms) for sure: a version such as 550.54.15, a bus id with a letter,
    or a character none of those forms has."""
    if head.count(".") >= 2 and not head.strip(_DIGITS + "."):
        return True
    if ":" in head and head.strip(_DIGITS + "_.:+- TtZ"):  # sexagesimal numbers and times have no other letter
        return True
    return bool(head.strip(_NUMBER_CHARS))


def _quoted(text: str) -> tuple[str, str]:
    """A quoted scalar at the start of ``text`` that ends on this line -> its value, the text after it."""
    if text[0] == "'":
        parts = []
        j = 1
        while True:
            k = text.find("'", j)
            if k < 0:
                raise _Outside
            parts.append(text[j:k])
            if text[k + 1:k + 2] != "'":
                return "".join(parts), text[k + 1:]
            parts.append("'")
            j = k + 2
    k = text.find('"', 1)
    if k < 0 or "\\" in text[1:k]:
        raise _Outside  # on more lines, or an escape: the whole parse reads it
    return text[1:k], text[k + 1:]


# -- JSON ----------------------------------------------------------------------------------
#
# Without an escape in the text, each '"' opens or closes a string. The text's strings are taken
# out (each left as one '"') and its white space dropped: what is left is its structure, small, in
# which a bracket is always one, and a list or object is stepped over by counting brackets.


def _json(text: str) -> Skimmed:
    if "\\" in text:
        raise _Outside  # an escape: the whole parse decodes it
    parts = text.split('"')
    if len(parts) % 2 == 0:
        raise _Outside  # a string not closed
    reader = _Json('"'.join(parts[0::2]).translate(_NO_SPACE), parts[1::2])
    return reader.spec()


_NO_SPACE = {ord(c): None for c in _SPACE}


class _Json:
    def __init__(self, skeleton: str, strings: list[str]) -> None:
        self.text = skeleton
        self.strings = strings
        self.at = 0  # a position in the skeleton, and how many strings come before it
        self.before = 0

    def spec(self) -> Skimmed:
        kind: list[str] = []
        own: list[Hook] = []
        devices: list[Hook] = []

        def top(key: str, i: int) -> int | None:
            if key == "kind":
                value, end = self.string(i)
                kind.append(value)
                return end
            if key == "containerEdits":
                return self.edits(i, own)
            if key == "devices":
                return self.array(i, lambda j: self.object(j, lambda key, v: self.edits(v, devices) if key == "containerEdits" else None))
            return None

        if self.object(0, top) != len(self.text) or len(kind) != 1:
            raise _Outside
        return kind[0], (*own, *devices)

    def edits(self, i: int, out: list[Hook]) -> int:
        def hook(j: int) -> int:
            found: dict[str, object] = {}

            def member(key: str, v: int) -> int | None:
                if key == "path":
                    found["path"], end = self.string(v)
                    return end
                if key == "args":
                    values: list[str] = []

                    def value(k: int) -> int:
                        item, end = self.string(k)
                        values.append(item)
                        return end

                    found["args"] = values
                    return self.array(v, value)
                return None

            end = self.object(j, member)
            out.append((str(found.get("path", "")), tuple(found.get("args", ()))))  # type: ignore[arg-type]
            return end

        return self.object(i, lambda key, v: self.array(v, hook) if key == "hooks" else None)

    def object(self, i: int, member: Callable[[str, int], int | None]) -> int:
        """The object at ``i``; ``member(key, position of its value)`` reads a value it wants (the
        position after it), or None: the value is stepped over. The position after the object."""
        text = self.text
        if text[i] != "{":
            raise _Outside
        i += 1
        if text[i] == "}":
            return i + 1
        seen = set()
        while True:
            key, i = self.string(i)
            if text[i] != ":":
                raise _Outside
            end = member(key, i + 1)
            if end is None:
                end = self.skip(i + 1)
            elif key in seen:
                raise _Outside  # the whole parse says what a key twice is
            else:
                seen.add(key)
            if text[end] == "}":
                return end + 1
            if text[end] != ",":
                raise _Outside
            i = end + 1

    def array(self, i: int, item: Callable[[int], int]) -> int:
        text = self.text
        if text[i] != "[":
            raise _Outside
        i += 1
        if text[i] == "]":
            return i + 1
        while True:
            i = item(i)
            if text[i] == "]":
                return i + 1
            if text[i] != ",":
                raise _Outside
            i += 1

    def string(self, i: int) -> tuple[str, int]:
        """The string at ``i`` -> its text, the position after it."""
        if self.text[i] != '"':
            raise _Outside
        self.before += self.text.count('"', self.at, i)  # the skeleton is read forward only
        self.at = i
        return self.strings[self.before], i + 1

    def skip(self, i: int) -> int:
        """The position after the value at ``i``."""
        text = self.text
        opening = text[i]
        if opening == '"':
            return i + 1
        if opening not in "[{":
            end = i
            while end < len(text) and text[end] not in ",}]":
                end += 1
            if end == i:
                raise _Outside
            return end
        closing = "]" if opening == "[" else "}"
        opened = closed = 0
        start = i
        while True:  # each closing bracket in turn, until as many have closed as opened
            end = text.find(closing, start)
            if end < 0:
                raise _Outside
            opened += text.count(opening, start, end)
            closed += 1
            if opened == closed:
                return end + 1
            start = end + 1
