"""A small shell lexer for coder.policy.shellparse, which only has to answer "which programs
would bash run?".

It keeps the text of literal words, marks words whose value is only known at run time
(`Word.dynamic`), and lexes the inside of every `$(...)`, backtick, `<(...)` and `>(...)` as a
command list of its own (`Lexer.nested`). Anything it cannot follow is refused rather than
guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from coder.policy.escapes import refuse


def _odd_backslashes(line: str) -> bool:
    """Whether `line` ends with an unescaped backslash (a line continuation)."""
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


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
REDIRECTS = frozenset({"<<<", "&>>", "<<-", "<<", "<>", "<&", ">&", ">>", ">|", "&>", "<", ">"})
ARITH = "((arith))"  # token for a `(( ... ))` arithmetic command: runs no program
_WORD_END = frozenset(" \t\n;&|()<>")
MAX_DEPTH = 40  # nesting of substitutions and `bash -c`; deeper is refused, not recursed


@dataclass
class Word:
    text: str  # value after quote removal (expansions contribute nothing)
    raw: str  # source text, to tell `FOO=1` (assignment) from `"FOO=1"` (a word)
    dynamic: bool = False  # contains $var, ${...}, $(...), `...`, $'...': value unknown here
    glob: bool = False  # unquoted * ? [ : the shell may expand it to other names
    brace: bool = False  # unquoted { or }: brace expansion ({curl,x} runs curl)

    @property
    def plain(self) -> bool:
        return self.raw == self.text and not self.dynamic


Token = Word | str


class Lexer:
    def __init__(self, src: str, nested: list[list[Token]], depth: int) -> None:
        if depth > MAX_DEPTH:
            raise refuse("substitutions are nested too deeply to check")
        self.s = src
        self.n = len(src)
        self.nested = nested  # token lists of every substitution found, shared by sub-lexers
        self.depth = depth
        self.heredocs: list[tuple[str, bool, bool]] = []  # (delimiter, expands, strip tabs)
        self.closing: dict[int, int] | None = None  # `(` index -> its `)` index, for arith_end

    def sub(self, text: str) -> Lexer:
        return Lexer(text, self.nested, self.depth + 1)

    def lex_list(self, i: int, close: str | None) -> tuple[list[Token], int]:
        """Tokens from i to the end (close=None) or to the `)` closing a `$(` (close=")")."""
        s, n = self.s, self.n
        tokens: list[Token] = []
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
                tokens.append(ARITH)
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
                tokens.append(Word("", s[i:j], dynamic=True))
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

    def word(self, i: int) -> tuple[Word, int]:
        s, n = self.s, self.n
        start, text = i, []
        w = Word("", "")
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
