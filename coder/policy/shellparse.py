"""Which programs would bash run for a command line?

A walker over the tokens of coder.policy.shelllex (literal words kept, words whose value is
only known at run time marked, every substitution and `bash -c` script a command list of its
own): it splits them into simple commands and unwraps `env`, `xargs`, `find -exec`,
`timeout`, ... to the program they run. Anything it cannot follow is refused
(`PolicyViolation`) rather than guessed. `commands.check_command` decides whether the programs
found are allowed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from coder.policy.env import runs_code
from coder.policy.escapes import ESCAPE_CHECKS, refuse
from coder.policy.shelllex import ARITH, MAX_DEPTH, REDIRECTS, Lexer, Token, Word

__all__ = ["basename", "program_words", "programs_in", "refuse"]


def basename(path: str) -> str:
    return path.rsplit("/", 1)[-1]


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


def _is_plain(token: Token, text: str) -> bool:
    return isinstance(token, Word) and token.plain and token.text == text


def _is_option(token: Token) -> bool:
    return isinstance(token, Word) and token.text.startswith("-")


def _programs_of(tokens: Sequence[Token], depth: int) -> list[str]:
    """Split a token list into simple commands and collect their programs."""
    programs: list[str] = []
    words: list[Word] = []
    header = False  # inside `for x in ...` up to the next separator
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if isinstance(t, Word):
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
        elif t in REDIRECTS:
            i += 1  # the next word is the redirection target, not a program
        elif t == "(":
            if words:
                raise refuse(
                    "unexpected `(` (function definitions and array assignments are not supported)"
                )
        elif t != ARITH:  # a separator: `;` `&&` `||` `|` `&` newline `)`
            programs += _simple(words, depth)
            words, header = [], False
        i += 1
    programs += _simple(words, depth)
    return programs


def _program_word(w: Word) -> str:
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


def _check_assignment(w: Word) -> None:
    m = _ASSIGNMENT.match(w.raw)
    if m and (m.group(1) == "PATH" or runs_code(m.group(1))):
        raise refuse(
            f"setting {m.group(1)} can make the shell run commands that cannot be "
            "checked (remove the assignment)"
        )


def _skip_options(
    args: Sequence[Word], takes_value: str = "", long_values: frozenset[str] = frozenset()
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
) -> Callable[[Sequence[Word], int], list[str]]:
    """A wrapper like `nohup prog ...`: skip its options and `operands`, then the rest is a
    command of its own."""

    def unwrap(args: Sequence[Word], depth: int) -> list[str]:
        j = _skip_options(args, takes_value, long_values) + operands
        return _simple(args[j:], depth)

    return unwrap


def _env(args: Sequence[Word], depth: int) -> list[str]:
    j = _skip_options(args, "uCS", frozenset({"--unset", "--chdir", "--split-string"}))
    if any(re.match(r"-[^-]*S|--split-string", a.text) for a in args[:j]):
        raise refuse("`env -S` splits a string into a command, which cannot be checked")
    while j < len(args) and args[j].text == "-":  # `env -` is `env -i`
        j += 1
    return _simple(args[j:], depth)  # _simple skips (and checks) the NAME=value words


def _xargs(args: Sequence[Word], depth: int) -> list[str]:
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


def _find(args: Sequence[Word], depth: int) -> list[str]:
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


def _shell(args: Sequence[Word], depth: int) -> list[str]:
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


def _trap(args: Sequence[Word], depth: int) -> list[str]:
    rest = args[_skip_options(args) :]
    if len(rest) < 2 or rest[0].text == "-":  # `trap SIG` / `trap - SIG` reset a handler
        return []
    if rest[0].dynamic:
        raise refuse("the action of `trap` is built at run time, which cannot be checked")
    return _programs(rest[0].text, depth + 1)


def _declare(args: Sequence[Word], depth: int) -> list[str]:
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

_WRAPPERS: dict[str, Callable[[Sequence[Word], int], list[str]]] = {
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


def _simple(words: Sequence[Word], depth: int) -> list[str]:
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
    if depth > MAX_DEPTH:
        raise refuse("commands are nested too deeply to check")
    if "\0" in cmd:
        raise refuse("the command contains a NUL byte")
    nested: list[list[Token]] = []
    try:
        tokens, _ = Lexer(cmd, nested, depth).lex_list(0, None)
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
