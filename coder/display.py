"""Text from a repository or a command made safe to show: what coder prints never drives the
terminal or forges a line.

A file name is the repository's (a command or the model chose it) and so is a command's output:
either can hold an escape sequence (`\\x1b]...`, `\\x1b[2J`) that a terminal would obey, a
carriage return that overwrites what came before, a newline that forges a line of its own, or
a bidirectional override that shows the text in another order than it is. `escaped` shows each
such character as git and libgit2 write it in a quoted name (`\\033`, `\\n`, `\\a`; beyond
ASCII `\\u202e`); `quoted_name` is a file name as git shows an unusual one (`"a\\033b"`), so
a name and its escapes cannot be confused, and it reads as in `git diff` and `coder diff`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# C0 controls and DEL, C1 controls (some terminals read \x9b as CSI), and the characters that
# reorder or break a line where it is shown: bidirectional marks and overrides, the Unicode line
# and paragraph separators.
_REORDERING = "\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
# A byte of a name that is not UTF-8, as Python keeps it (surrogateescape): shown as git shows
# the byte (`\377`).
_RAW_BYTES = "\udc80-\udcff"
_UNSAFE = "\x00-\x1f\x7f-\x9f" + _REORDERING + _RAW_BYTES
_UNSAFE_CHAR = re.compile(f"[{_UNSAFE}]")
_UNSAFE_IN_LINES = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_REORDERING}{_RAW_BYTES}]")  # \t, \n
_NAMED = {
    "\a": "\\a",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\v": "\\v",
    "\f": "\\f",
    "\r": "\\r",
}
_NEEDS_QUOTES = re.compile(f'[{_UNSAFE}"\\\\]')


def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a raw byte (surrogateescape)
        code -= 0xDC00
    return f"\\{code:03o}" if code < 0x100 else f"\\u{code:04x}"


def escaped(text: str, *, lines: bool = False) -> str:
    """`text` with every control character shown as an escape. `lines`: a multi-line text
    (a patch, a command's output) keeps its newlines and tabs, every other control is shown."""
    pattern = _UNSAFE_IN_LINES if lines else _UNSAFE_CHAR
    return pattern.sub(lambda m: _escape(m.group()), text)


def quoted_name(name: str) -> str:
    """A file name to print: as it is when it is plain, else in double quotes with its
    controls, quotes and backslashes escaped (as git quotes an unusual name)."""
    if not _NEEDS_QUOTES.search(name):
        return name
    inner = name.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + _UNSAFE_CHAR.sub(lambda m: _escape(m.group()), inner) + '"'


def counted(count: int, noun: str) -> str:
    """`1 step`, `2 steps`: `count` and `noun`, plural when it is not one."""
    return f"{count} {noun}" + "s" * (count != 1)


def listed(items: Sequence[str], limit: int) -> str:
    """`a, b, c and 4 more`: the first `limit` of `items`, and how many were left out."""
    more = len(items) - limit
    return ", ".join(items[:limit]) + (f" and {more} more" if more > 0 else "")
