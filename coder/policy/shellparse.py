"""Which programs would bash run for a command line?

A small shell lexer and walker: it keeps the text of literal words, marks words whose value is
only known at run time, lexes every substitution and `bash -c` script as a command list of its
own, and unwraps `env`, `xargs`, `find -exec`, `timeout`, ... to the program they run. Anything
it cannot follow is refused (`PolicyViolation`) rather than guessed. `commands.check_command`
decides whether the programs found are allowed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from coder.policy.env import runs_code
from coder.policy.escapes import ESCAPE_CHECKS, refuse

__all__ = ["basename", "program_words", "programs_in", "refuse"]


def _odd_backslashes(line: str) -> bool:
    """Whether `line` ends with an unescaped backslash (a line continuation)."""
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def basename(path: str) -> str:
    return path.rsplit("/", 1)[-1]


# --------------------------------------------------------------------------------------------
# A small shell lexer. It only has to answer "which programs would bash run?", so it keeps the
# text of literal words, marks words whose value is only known at run time (`dynamic`), and
# lexes the inside of every `$(...)`, backtick, `<(...)` and `>(...)` as a command list of its
# own. Anything it cannot follow is refused rather than guessed.
# --------------------------------------------------------------------------------------------

# Longest first, so `&&` is not read as `&` `&`.
_OPERATORS = (
    "<<<",
    ";;&",
    "&>>",
    "<<-",
    "&&",
    "||",
    ";;",
    ";&",
    "|&",
    "<<",
    "<>",
    "<&",
    ">&",
    ">>",
    ">|",
    "&>",
    ";",
    "|",
    "&",
    "<",
    ">",
)
_REDIRECTS = frozenset({"<<<", "&>>", "<<-", "<<", "<>", "<&", ">&", ">>", ">|", "&>", "<", ">"})
_ARITH = "((arith))"  # token for a `(( ... ))` arithmetic command: runs no program
_WORD_END = frozenset(" \t\n;&|()<>")
_MAX_DEPTH = 40  # nesting of substitutions and `bash -c`; deeper is refused, not recursed


@dataclass
class _Word:
    text: str  # value after quote removal (expansions contribute nothing)
    raw: str  # source text, to tell `FOO=1` (assignment) from `"FOO=1"` (a word)
    dynamic: bool = False  # contains $var, ${...}, $(...), `...`, $'...': value unknown here
    glob: bool = False  # unquoted * ? [ : the shell may expand it to other names
    brace: bool = False  # unquoted { or }: brace expansion ({curl,x} runs curl)

    @property
    def plain(self) -> bool:
        return self.raw == self.text and not self.dynamic


_Token = _Word | str


class _Lexer:
    def __init__(self, src: str, nested: list[list[_Token]], depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise refuse("substitutions are nested too deeply to check")
        self.s = src
        self.n = len(src)
        self.nested = nested  # token lists of every substitution found, shared by sub-lexers
        self.depth = depth
        self.heredocs: list[tuple[str, bool, bool]] = []  # (delimiter, expands, strip tabs)
        self.closing: dict[int, int] | None = None  # `(` index -> its `)` index, for arith_end

    def sub(self, text: str) -> _Lexer:
        return _Lexer(text, self.nested, self.depth + 1)

    def lex_list(self, i: int, close: str | None) -> tuple[list[_Token], int]:
        """Tokens from i to the end (close=None) or to the `)` closing a `$(` (close=")")."""
        s, n = self.s, self.n
        tokens: list[_Token] = []
        parens = 0  # open `(` subshells at this level
        while True:
            while i < n and (s[i] in " \t" or s.startswith("\\\n", i)):
                i += 2 if s[i] == "\\" else 1
            if i >= n:
                if close or parens:
                    raise refuse("unbalanced parentheses")
                return tokens, i
            c = s[i]
            if c == "#":  # a comment runs to the end of the line
                while i < n and s[i] != "\n":
                    i += 1
            elif c == "\n":
                tokens.append("\n")
                i = self.read_heredocs(i + 1)
            elif s.startswith("((", i) and (end := self.arith_end(i + 2)) >= 0:
                self.sub(s[i + 2 : end]).scan_expansions()
                tokens.append(_ARITH)
                i = end + 2
            elif c == "(":
                tokens.append("(")
                parens += 1
                i += 1
            elif c == ")":
                if parens:
                    tokens.append(")")
                    parens -= 1
                    i += 1
                elif close == ")":
                    return tokens, i + 1
                elif re.search(r"(^|[\s;&|(])case\s", s):  # `pat)` of a case statement
                    raise refuse(
                        "`case` is not supported in commands (use if/elif, or a "
                        "script run by an allowed interpreter)"
                    )
                else:
                    raise refuse("unbalanced parentheses")
            elif s.startswith(("<(", ">("), i):  # process substitution: a command list
                inner, j = self.lex_list(i + 2, ")")
                self.nested.append(inner)
                tokens.append(_Word("", s[i:j], dynamic=True))
                i = j
            else:
                m = re.match(r"\d+(?=[<>])", s[i : i + 12])  # fd number of `2>&1`, `3<in`
                start = i + (m.end() if m else 0)
                op = next((o for o in _OPERATORS if s.startswith(o, start)), None)
                if op is None:
                    word, i = self.word(i)
                    tokens.append(word)
                    continue
                tokens.append(op)
                i = start + len(op)
                if op in ("<<", "<<-"):  # here-document: its delimiter word comes next
                    while i < n and s[i] in " \t":
                        i += 1
                    word, i = self.word(i)
                    tokens.append(word)
                    if word.dynamic or not word.text:  # bash would not expand it: `<<$X`
                        raise refuse("a here-document delimiter must be a plain word")
                    expands = word.raw == word.text  # a quoted delimiter means a literal body
                    self.heredocs.append((word.text, expands, op == "<<-"))

    def word(self, i: int) -> tuple[_Word, int]:
        s, n = self.s, self.n
        start, text = i, []
        w = _Word("", "")
        while i < n and s[i] not in _WORD_END:
            c = s[i]
            if c == "\\":
                if s.startswith("\\\n", i):  # line continuation
                    i += 2
                    continue
                text.append(s[i + 1 : i + 2])
                i += 2
            elif c == "'":
                j = s.find("'", i + 1)
                if j < 0:
                    raise refuse("unbalanced single quote")
                text.append(s[i + 1 : j])
                i = j + 1
            elif c == '"':
                part, dyn, i = self.dquote(i + 1)
                text.append(part)
                w.dynamic |= dyn
            elif c == "`":
                i = self.backtick(i + 1)
                w.dynamic = True
            elif c == "$":
                part, dyn, i = self.dollar(i, in_dquote=False)
                text.append(part)
                w.dynamic |= dyn
            else:
                w.glob |= c in "*?["
                w.brace |= c in "{}"
                text.append(c)
                i += 1
        w.text, w.raw = "".join(text), s[start:i]
        return w, i

    def dquote(self, i: int) -> tuple[str, bool, int]:
        """Inside "...": only $, backticks and \\ are special. Returns (text, dynamic, end)."""
        s, n = self.s, self.n
        text: list[str] = []
        dynamic = False
        while i < n:
            c = s[i]
            if c == '"':
                return "".join(text), dynamic, i + 1
            if c == "\\" and i + 1 < n and s[i + 1] in '$`"\\\n':
                if s[i + 1] != "\n":
                    text.append(s[i + 1])
                i += 2
            elif c == "`":
                i = self.backtick(i + 1)
                dynamic = True
            elif c == "$":
                part, dyn, i = self.dollar(i, in_dquote=True)
                text.append(part)
                dynamic |= dyn
            else:
                text.append(c)
                i += 1
        raise refuse("unbalanced double quote")

    def backtick(self, i: int) -> int:
        """`...` : undo its backslash escapes and lex the inside as a command list."""
        s, n = self.s, self.n
        inner = []
        while i < n and s[i] != "`":
            if s[i] == "\\" and i + 1 < n and s[i + 1] in "`\\$":
                inner.append(s[i + 1])
                i += 2
            else:
                inner.append(s[i])
                i += 1
        if i >= n:
            raise refuse("unbalanced backtick")
        tokens, _ = self.sub("".join(inner)).lex_list(0, None)
        self.nested.append(tokens)
        return i + 1

    def dollar(self, i: int, in_dquote: bool) -> tuple[str, bool, int]:
        """At a `$`: returns (literal text, dynamic, end)."""
        s = self.s
        nxt = s[i + 1 : i + 2]
        if s.startswith("$((", i) and (end := self.arith_end(i + 3)) >= 0:
            self.sub(s[i + 3 : end]).scan_expansions()  # arithmetic may hold $(...) too
            return "", True, end + 2
        if nxt == "(":
            tokens, j = self.lex_list(i + 2, ")")
            self.nested.append(tokens)
            return "", True, j
        if nxt == "{":
            return "", True, self.brace_end(i + 2)
        if nxt == "'" and not in_dquote:  # $'\x63url' spells curl: never a literal name
            j = i + 2
            while j < self.n and s[j] != "'":
                j += 2 if s[j] == "\\" else 1
            if j >= self.n:
                raise refuse("unbalanced single quote")
            return s[i + 2 : j], True, j + 1
        if nxt == '"' and not in_dquote:  # $"..." is a translated "..."
            return self.dquote(i + 2)
        if m := re.match(r"[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-]", s[i + 1 : i + 65]):
            return "", True, i + 1 + m.end()
        if nxt == "[":  # old-style arithmetic $[...]: `<<` inside is a shift, not a heredoc
            depth, j = 0, i + 1
            while j < self.n and not (s[j] == "]" and depth == 1):
                depth += {"[": 1, "]": -1}.get(s[j], 0)
                j += 1
            if j >= self.n:
                raise refuse("unbalanced $[")
            self.sub(s[i + 2 : j]).scan_expansions()
            return "", True, j + 1
        return "$", False, i + 1

    def brace_end(self, i: int) -> int:
        """End of a `${...}`. Single quotes are not trusted as quoting here (inside "${x:-'...'}"
        bash runs `$(...)` anyway), so every substitution inside is lexed."""
        s, n = self.s, self.n
        depth = 1
        while i < n:
            c = s[i]
            if c == "\\":
                i += 2
            elif c == '"':
                i = self.dquote(i + 1)[2]
            elif c == "`":
                i = self.backtick(i + 1)
            elif c == "$":
                i = self.dollar(i, in_dquote=True)[2]
            else:
                depth += {"{": 1, "}": -1}.get(c, 0)
                i += 1
                if depth == 0:
                    return i
        raise refuse("unbalanced ${")

    def arith_end(self, i: int) -> int:
        """Index of the `))` closing an arithmetic `$((`/`((` whose second `(` is at i - 1, or
        -1 (then it is a subshell inside a substitution, e.g. `$( (cd x; ls) )`)."""
        if self.closing is None:  # one pass, so a line of `((((` is not quadratic
            self.closing, opened = {}, []
            for j, c in enumerate(self.s):
                if c == "(":
                    opened.append(j)
                elif c == ")" and opened:
                    self.closing[opened.pop()] = j
        j = self.closing.get(i - 1, -1)
        return j if j >= 0 and self.s.startswith("))", j) else -1

    def scan_expansions(self) -> None:
        """Text where only expansions matter (here-document bodies, arithmetic)."""
        i = 0
        while i < self.n:
            c = self.s[i]
            if c == "\\":
                i += 2
            elif c == "`":
                i = self.backtick(i + 1)
            elif c == "$":
                i = self.dollar(i, in_dquote=True)[2]
            else:
                i += 1

    def read_heredocs(self, i: int) -> int:
        """After a newline: consume pending here-document bodies."""
        for delimiter, expands, strip in self.heredocs:
            while i < self.n:
                end = self.s.find("\n", i)
                end = self.n if end < 0 else end
                line = self.s[i:end]
                i = end + 1
                # In an expanding body bash joins `\<newline>` first, even for the delimiter.
                while expands and i <= self.n and _odd_backslashes(line):
                    end = self.s.find("\n", i)
                    end = self.n if end < 0 else end
                    line = line[:-1] + self.s[i:end]
                    i = end + 1
                if (line.lstrip("\t") if strip else line) == delimiter:
                    break
                if expands:
                    self.sub(line).scan_expansions()
        self.heredocs.clear()
        return min(i, self.n)


# --------------------------------------------------------------------------------------------
# From tokens to programs.
# --------------------------------------------------------------------------------------------

# Reserved words after which a command starts; `for`/`select` headers run nothing themselves.
_KEYWORDS = frozenset(
    {
        "if",
        "then",
        "else",
        "elif",
        "fi",
        "do",
        "done",
        "while",
        "until",
        "!",
        "{",
        "}",
        "time",
        "coproc",
    }
)
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\[[^\]]*\])?\+?=")
# PATH: programs are checked as the PATH coder gives commands finds them (`PATH=.:$PATH cat`
# would run a `cat` the command wrote); the variables that make a program run code named in
# their value are coder.policy.env's (`runs_code`), the same that a step's `env:` cannot set.
_CODE_RUNNERS = {
    "eval": "`eval` runs a string as code, which cannot be checked (run the commands directly)",
    "source": "`source` runs a file as code, which cannot be checked (run its commands directly)",
    ".": "`.` (source) runs a file as code, which cannot be checked (run its commands directly)",
}
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "ash", "mksh"})


def _is_plain(token: _Token, text: str) -> bool:
    return isinstance(token, _Word) and token.plain and token.text == text


def _is_option(token: _Token) -> bool:
    return isinstance(token, _Word) and token.text.startswith("-")


def _programs_of(tokens: Sequence[_Token], depth: int) -> list[str]:
    """Split a token list into simple commands and collect their programs."""
    programs: list[str] = []
    words: list[_Word] = []
    header = False  # inside `for x in ...` up to the next separator
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if isinstance(t, _Word):
            if header:  # `for x do ...` and `for ((...)) { ...; }` start the body unseparated
                header = not (t.plain and t.text in ("do", "{"))
            elif words or not t.plain:
                words.append(t)
            elif t.text == "[[":  # `&&`, `||`, `(`, `<` inside [[ ]] are not shell operators
                i += 1
                while i < len(tokens) and not _is_plain(tokens[i], "]]"):
                    i += 1
                if i >= len(tokens):
                    raise refuse("`[[` without a closing `]]`")
            elif t.text in _KEYWORDS:
                if t.text == "time":  # `time -p cmd`
                    while i + 1 < len(tokens) and _is_option(tokens[i + 1]):
                        i += 1
            elif t.text in ("for", "select"):
                header = True
            elif t.text in ("case", "function"):
                raise refuse(
                    f"`{t.text}` is not supported in commands (use if/elif, or a "
                    "script run by an allowed interpreter)"
                )
            else:
                words.append(t)
        elif t in _REDIRECTS:
            i += 1  # the next word is the redirection target, not a program
        elif t == "(":
            if words:
                raise refuse(
                    "unexpected `(` (function definitions and array assignments are not supported)"
                )
        elif t != _ARITH:  # a separator: `;` `&&` `||` `|` `&` newline `)`
            programs += _simple(words, depth)
            words, header = [], False
        i += 1
    programs += _simple(words, depth)
    return programs


def _program_word(w: _Word) -> str:
    """The program as written (`cat`, `./cat`, `/usr/bin/cat`), if it can be checked."""
    if w.dynamic:
        raise refuse(
            f"the program `{w.raw}` is given by a variable or substitution, which "
            "cannot be checked (write the program name literally)"
        )
    if (w.glob and w.text != "[") or w.brace:
        raise refuse(
            f"the program `{w.raw}` is a pattern the shell would expand, which "
            "cannot be checked (write the program name literally)"
        )
    if not basename(w.text):
        raise refuse(f"`{w.raw}` is not a program name")
    return w.text


def _check_assignment(w: _Word) -> None:
    m = _ASSIGNMENT.match(w.raw)
    if m and (m.group(1) == "PATH" or runs_code(m.group(1))):
        raise refuse(
            f"setting {m.group(1)} can make the shell run commands that cannot be "
            "checked (remove the assignment)"
        )


def _skip_options(
    args: Sequence[_Word], takes_value: str = "", long_values: frozenset[str] = frozenset()
) -> int:
    """Index of the first operand, getopt-style. `takes_value` lists the short options with a
    value (`-n 5` or `-n5`); `long_values` the long ones given as `--opt value`."""
    j = 0
    while j < len(args):
        t = args[j].text
        if t == "--":
            return j + 1
        if t.startswith("--"):
            j += 2 if "=" not in t and t in long_values else 1
        elif t.startswith("-") and len(t) > 1:
            j += 1
            for pos, ch in enumerate(t[1:], 1):
                if ch in takes_value:
                    j += pos == len(t) - 1  # no attached value: it is the next word
                    break
        else:
            return j
    return j


def _then(
    takes_value: str = "", long_values: frozenset[str] = frozenset(), operands: int = 0
) -> Callable[[Sequence[_Word], int], list[str]]:
    """A wrapper like `nohup prog ...`: skip its options and `operands`, then the rest is a
    command of its own."""

    def unwrap(args: Sequence[_Word], depth: int) -> list[str]:
        j = _skip_options(args, takes_value, long_values) + operands
        return _simple(args[j:], depth)

    return unwrap


def _env(args: Sequence[_Word], depth: int) -> list[str]:
    j = _skip_options(args, "uCS", frozenset({"--unset", "--chdir", "--split-string"}))
    if any(re.match(r"-[^-]*S|--split-string", a.text) for a in args[:j]):
        raise refuse("`env -S` splits a string into a command, which cannot be checked")
    while j < len(args) and args[j].text == "-":  # `env -` is `env -i`
        j += 1
    return _simple(args[j:], depth)  # _simple skips (and checks) the NAME=value words


def _xargs(args: Sequence[_Word], depth: int) -> list[str]:
    j = _skip_options(
        args,
        "adEILnPs",
        frozenset(
            {
                "--arg-file",
                "--delimiter",
                "--max-args",
                "--max-procs",
                "--max-chars",
                "--process-slot-var",
            }
        ),
    )
    if j >= len(args):
        return ["echo"]  # xargs runs echo by default
    programs = _simple(args[j:], depth)
    # xargs appends its input to the command: `xargs env` or `xargs find .` would take the
    # program (or a `-exec prog`) from that input.
    names = [basename(p) for p in programs]
    if names and (names[-1] in _PROGRAM_TAKERS or "find" in names):
        raise refuse(
            f"`xargs {args[j].raw}` would take the program to run from its input, "
            "which cannot be checked (name the program after it)"
        )
    return programs


def _find(args: Sequence[_Word], depth: int) -> list[str]:
    programs: list[str] = []
    j = 0
    while j < len(args):
        if args[j].text in ("-exec", "-execdir", "-ok", "-okdir"):
            k = j + 1
            while k < len(args) and args[k].text not in (";", "+"):
                k += 1
            programs += _simple(args[j + 1 : k], depth)
            j = k
        j += 1
    return programs


def _shell(args: Sequence[_Word], depth: int) -> list[str]:
    """`bash -c 'script' [name args...]`: the script is checked like any command line."""
    j, has_c = 0, False
    while j < len(args):
        t = args[j].text
        if t in ("-", "--"):
            j += 1
            break
        if t.startswith("--"):
            j += 2 if t in ("--rcfile", "--init-file") else 1
        elif len(t) > 1 and t[0] in "-+":
            has_c |= t[0] == "-" and "c" in t
            j += 2 if ("o" in t or "O" in t) else 1  # -o/-O take an option name
        else:
            break
    if not has_c:
        raise refuse(
            "a shell may only run as `bash -c '<script>'`, whose script is checked "
            "(run the commands directly, or run a script as ./name.sh and add "
            "name.sh to allowed_commands in coder.config.json)"
        )
    if j >= len(args):
        return []
    if args[j].dynamic:
        raise refuse(
            f"the script of `-c` is built at run time ({args[j].raw}), which cannot "
            "be checked (write it literally)"
        )
    return _programs(args[j].text, depth + 1)


def _trap(args: Sequence[_Word], depth: int) -> list[str]:
    rest = args[_skip_options(args) :]
    if len(rest) < 2 or rest[0].text == "-":  # `trap SIG` / `trap - SIG` reset a handler
        return []
    if rest[0].dynamic:
        raise refuse("the action of `trap` is built at run time, which cannot be checked")
    return _programs(rest[0].text, depth + 1)


def _declare(args: Sequence[_Word], depth: int) -> list[str]:
    for a in args:
        _check_assignment(a)
    return []


# Wrappers whose program, when missing, xargs would fill in from its input.
_PROGRAM_TAKERS = frozenset(
    {
        "env",
        "timeout",
        "nice",
        "nohup",
        "setsid",
        "command",
        "builtin",
        "exec",
        "stdbuf",
        "time",
        "xargs",
    }
)

_WRAPPERS: dict[str, Callable[[Sequence[_Word], int], list[str]]] = {
    "env": _env,
    "xargs": _xargs,
    "find": _find,
    "trap": _trap,
    "timeout": _then("sk", frozenset({"--signal", "--kill-after"}), operands=1),
    "nice": _then("n", frozenset({"--adjustment"})),
    "nohup": _then(),
    "setsid": _then(),
    "command": _then(),
    "builtin": _then(),
    "exec": _then("a"),
    "stdbuf": _then("ioe", frozenset({"--input", "--output", "--error"})),
    "time": _then("fo", frozenset({"--format", "--output"})),
    **{name: _shell for name in _SHELLS},
    **{name: _declare for name in ("export", "declare", "typeset", "local", "readonly")},
    **ESCAPE_CHECKS,
}


def _simple(words: Sequence[_Word], depth: int) -> list[str]:
    """Programs of one simple command: `[NAME=value ...] program args...`."""
    k = 0
    while k < len(words) and _ASSIGNMENT.match(words[k].raw):
        _check_assignment(words[k])
        k += 1
    if k == len(words):
        return []
    word = _program_word(words[k])
    name = basename(word)
    if name in _CODE_RUNNERS:
        raise refuse(_CODE_RUNNERS[name])
    unwrap = _WRAPPERS.get(name)
    return [word] + (unwrap(words[k + 1 :], depth) if unwrap else [])


def _programs(cmd: str, depth: int) -> list[str]:
    if depth > _MAX_DEPTH:
        raise refuse("commands are nested too deeply to check")
    if "\0" in cmd:
        raise refuse("the command contains a NUL byte")
    nested: list[list[_Token]] = []
    try:
        tokens, _ = _Lexer(cmd, nested, depth).lex_list(0, None)
    except RecursionError:  # thousands of nested $( or ${: refuse rather than crash
        raise refuse("substitutions are nested too deeply to check") from None
    programs = _programs_of(tokens, depth)
    for inner in nested:  # grows no further: every substitution was lexed above
        programs += _programs_of(inner, depth)
    return programs


def program_words(cmd: str) -> list[str]:
    """Every program bash would run for `cmd`, as written (`cat`, `./cat`, `/bin/cat`), in
    order of appearance.

    Raises PolicyViolation for what cannot be checked: eval/source, unbalanced quotes or
    parentheses, a program named by a variable or substitution, `case`, functions, and the
    options of allowed programs that run other programs (`git -c`, sed's `e`, tar's
    `--to-command`, ...: see `escapes`).
    """
    return _programs(cmd, 0)


def programs_in(cmd: str) -> list[str]:
    """`program_words`, by basename."""
    return [basename(word) for word in _programs(cmd, 0)]
