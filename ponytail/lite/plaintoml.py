"""Read the plain TOML a config file is made of, without importing tomllib.

Importing tomllib (typing, datetime, its regexes) would weigh on every container
start (bench/importcost.py). A ponytail config is a few ``[table]`` headers with ``key = "string"``,
``key = ['string', ...]``, ``key = true`` or ``key = 42`` lines and comments. This
reads exactly that subset and gives up (None) on anything else: another kind of
value, an escape in a string, an integer of over MAX_DIGITS digits, a dotted or quoted key (but for a two-part table
header such as ``[drivers.build-1]``), an inline table, a repeated key or table, a
table both named alone and as the first part of a header, a control character. The caller then parses the text with tomllib,
which also words the errors. So whatever this returns is what tomllib returns.
"""

from __future__ import annotations

_BARE_KEY = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_DIGITS = frozenset("0123456789")
_VALUE_END = frozenset(" \t\r\n#,]")
_QUOTES = frozenset("\"'")
_SPACES = frozenset(" \t")
MAX_DIGITS = 4000
Table = dict[str, object]


class _NotPlain(Exception):
    """Outside the subset: leave the text to tomllib."""


def loads_plain(text: str) -> dict[str, Table] | None:
    """The tables of ``text`` if it is plain TOML as above, else None."""
    try:
        return _Reader(text).document()
    except _NotPlain:
        return None


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def document(self) -> dict[str, Table]:
        tables: dict[str, Table] = {}
        table: Table | None = None
        parents: set[str] = set()  # first parts of [a.b] headers
        while self._skip_blank_lines():
            if self._peek() == "[":
                self.pos += 1
                name = self._spaced_key()
                if self._peek() == ".":
                    self.pos += 1
                    child = self._spaced_key()
                    self._expect("]")
                    if name in tables and name not in parents:
                        raise _NotPlain
                    parents.add(name)
                    parent = tables.setdefault(name, {})
                    if child in parent:
                        raise _NotPlain
                    table = {}
                    parent[child] = table
                    self._end_of_line()
                    continue
                self._expect("]")
                if name in tables:
                    raise _NotPlain
                table = tables[name] = {}
            else:
                key = self._spaced_key()
                self._expect("=")
                self._spaces()
                value = self._value()
                if table is None or key in table:
                    raise _NotPlain
                table[key] = value
            self._end_of_line()
        return tables

    # -- values ---------------------------------------------------------------------
    def _value(self) -> object:
        c = self._peek()
        if c == "[":
            return self._array()
        if c in _QUOTES:
            return self._string(c)
        for word, value in (("true", True), ("false", False)):
            if self.text.startswith(word, self.pos):
                self.pos += len(word)
                self._check_value_end()
                return value
        return self._integer()

    def _array(self) -> list[object]:
        self.pos += 1
        items: list[object] = []
        while True:
            self._skip_blank_lines(in_array=True)
            if self._peek() == "]":
                self.pos += 1
                return items
            if self._peek() not in _QUOTES:
                raise _NotPlain  # only strings in arrays
            items.append(self._string(self._peek()))
            self._skip_blank_lines(in_array=True)
            if self._peek() == ",":
                self.pos += 1
            elif self._peek() != "]":
                raise _NotPlain

    def _string(self, quote: str) -> str:
        end = self.text.find(quote, self.pos + 1)
        if end < 0:
            raise _NotPlain
        value = self.text[self.pos + 1 : end]
        if value == "" and self.text.startswith(quote, end + 1):
            raise _NotPlain  # a multi-line string
        if (quote == '"' and "\\" in value) or not _printable(value):
            raise _NotPlain
        self.pos = end + 1
        return value

    def _integer(self) -> int:
        start = self.pos
        if self._peek() in ("+", "-"):
            self.pos += 1
        digits = self.pos
        while self._peek() in _DIGITS:
            self.pos += 1
        number = self.text[digits : self.pos]
        if not number or (number.startswith("0") and len(number) > 1) or len(number) > MAX_DIGITS:
            raise _NotPlain  # a longer number: tomllib decides (int() refuses over 4300 digits)
        self._check_value_end()
        return int(self.text[start : self.pos])

    # -- layout ---------------------------------------------------------------------
    def _spaced_key(self) -> str:
        self._spaces()
        start = self.pos
        while self._peek() in _BARE_KEY:
            self.pos += 1
        if self.pos == start:
            raise _NotPlain
        key = self.text[start : self.pos]
        self._spaces()
        return key

    def _skip_blank_lines(self, in_array: bool = False) -> bool:
        """Past spaces, comments and line ends; False at the end of the text."""
        while True:
            self._spaces()
            c = self._peek()
            if c == "#":
                self._comment()
            elif c == "\n":
                self.pos += 1
            elif c == "\r" and self.text.startswith("\r\n", self.pos):
                self.pos += 2
            elif c == "":
                if in_array:
                    raise _NotPlain
                return False
            else:
                return True

    def _end_of_line(self) -> None:
        self._spaces()
        if self._peek() == "#":
            self._comment()
        if self.text.startswith("\r\n", self.pos):
            self.pos += 2
        elif self._peek() == "\n":
            self.pos += 1
        elif self._peek() != "":
            raise _NotPlain

    def _comment(self) -> None:
        end = self.text.find("\n", self.pos)
        end = len(self.text) if end < 0 else end
        comment = self.text[self.pos : end].removesuffix("\r")
        if not _printable(comment):
            raise _NotPlain
        self.pos += len(comment)

    def _spaces(self) -> None:
        text, pos, end = self.text, self.pos, len(self.text)
        while pos < end and text[pos] in _SPACES:
            pos += 1
        self.pos = pos

    def _expect(self, c: str) -> None:
        if self._peek() != c:
            raise _NotPlain
        self.pos += 1

    def _check_value_end(self) -> None:
        if self._peek() not in _VALUE_END and self._peek() != "":
            raise _NotPlain

    def _peek(self) -> str:
        return self.text[self.pos : self.pos + 1]


def _printable(text: str) -> bool:
    """No control character but tab (TOML allows none in strings and comments)."""
    return text.isprintable() or all(c == "\t" or (" " <= c and c != "\x7f") for c in text)
