"""Options of allowed programs that run other programs: refused, since what they run cannot
be checked (`git -c alias.x='!cmd'`, sed's `e` command, `tar --to-command`, ...).

Each check takes the words after the program's name (`shell` hands them in) and returns the
programs it starts in turn (none here; `find -exec`, `xargs`, `env` ... are unwrapped in
`shell`), or raises PolicyViolation. The kernel sandbox is the wall; these are the clear error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from coder.errors import PolicyViolation


class Word(Protocol):
    text: str  # the word after quote removal
    raw: str  # as written
    dynamic: bool  # holds an expansion: its value is only known at run time


def refuse(why: str) -> PolicyViolation:
    return PolicyViolation(f"command refused: {why}")


def _abbreviates(option: str, names: Sequence[str]) -> str | None:
    """The long option `option` (maybe `--name=value`, maybe abbreviated, as git and tar
    accept) stands for, among `names`."""
    name = option.split("=", 1)[0]
    if not name.startswith("--") or len(name) < 5:
        return None
    return next((n for n in names if n.startswith(name)), None)


# --- git -----------------------------------------------------------------------------------

_GIT_RUNS = ("--upload-pack", "--receive-pack", "--exec", "--extcmd", "--config-env", "--tool")
_GIT_GLOBAL_VALUE = frozenset({"-C", "--git-dir", "--work-tree", "--namespace", "--super-prefix"})
# subcommand -> its short options that name a program
_GIT_SHORT_RUNS = {
    "clone": "u",
    "fetch": "u",
    "pull": "u",
    "ls-remote": "u",
    "push": "",
    "archive": "",
    "rebase": "x",
    "difftool": "xt",
    "mergetool": "t",
}


def _git(args: Sequence[Word], depth: int) -> list[str]:
    j = 0
    while j < len(args) and (args[j].text.startswith("-") or args[j].dynamic):
        t = args[j].text
        if args[j].dynamic:
            raise refuse(
                f"`git {args[j].raw}`: an option built at run time cannot be checked "
                "(write it literally)"
            )
        if (
            t.startswith("-c")
            or _abbreviates(t, ("--config-env", "--exec-path="))
            or (t.startswith("--exec-path="))
        ):
            raise refuse(
                f"`git {t}` overrides git's configuration or programs (aliases, core.*), "
                "which can run commands that cannot be checked"
            )
        j += 2 if t in _GIT_GLOBAL_VALUE else 1
    if j >= len(args):
        return []
    sub, rest = args[j].text, args[j + 1 :]
    shorts = _GIT_SHORT_RUNS.get(sub, "")
    for word in rest:
        t = word.text
        runs = _abbreviates(t, _GIT_RUNS)
        short = t.startswith("-") and not t.startswith("--") and any(c in t[1:] for c in shorts)
        if runs or short:
            raise refuse(
                f"`git {sub} {t}` runs a program named in its options, which cannot be checked"
            )
        if word.dynamic and sub in _GIT_SHORT_RUNS:
            raise refuse(
                f"`git {sub} {word.raw}`: an argument built at run time could name a program "
                "to run (write it literally)"
            )
    texts = [w.text for w in rest]
    if (
        sub == "filter-branch"
        or (sub == "bisect" and texts[:1] == ["run"])
        or (sub == "submodule" and "foreach" in texts)
    ):
        raise refuse(f"`git {sub}` runs commands given to it, which cannot be checked")
    if sub == "config" and any(t.lower().startswith(("alias.", "core.")) for t in texts):
        raise refuse(
            "`git config alias.*` / `core.*` can make git run commands that cannot be checked "
            "(set them in your own git configuration)"
        )
    return []


# --- sed -----------------------------------------------------------------------------------


def _sed(args: Sequence[Word], depth: int) -> list[str]:
    scripts: list[Word | str] = []
    operands: list[Word] = []
    j = 0
    while j < len(args):
        word, t = args[j], args[j].text
        j += 1
        if t == "--":
            operands += args[j:]
            break
        if t.startswith("--"):
            name, eq, value = t.partition("=")
            if name in ("--file",) or _abbreviates(name, ("--file",)):
                raise _sed_file()
            if name == "--expression" or _abbreviates(name, ("--expression",)):
                if eq:
                    scripts.append(value)
                elif j < len(args):
                    scripts.append(args[j])
                    j += 1
            continue
        if not t.startswith("-") or t == "-":
            operands.append(word)
            continue
        for pos, c in enumerate(t[1:], 1):
            if c == "f":
                raise _sed_file()
            if c in "eil":  # the rest of the word (or the next word) is their value
                value = t[pos + 1 :]
                if c == "e":
                    if value:
                        scripts.append(value)
                    elif j < len(args):
                        scripts.append(args[j])
                        j += 1
                elif c == "l" and not value:
                    j += 1
                break
    if not scripts and operands:  # the first operand is the script
        scripts.append(operands[0])
    for script in scripts:
        if not isinstance(script, str) and script.dynamic:
            raise refuse(f"the sed script {script.raw} is built at run time and cannot be checked")
        problem = _sed_script_problem(script if isinstance(script, str) else script.text)
        if problem:
            raise refuse(problem)
    return []


def _sed_file() -> PolicyViolation:
    return refuse("`sed -f` reads its script from a file, which cannot be checked")


def _sed_script_problem(script: str) -> str | None:
    """Why a sed script cannot run (its `e`, `w`, `W` commands or `s///e`/`s///w`), or None."""
    i, n = 0, len(script)

    def delimited(i: int) -> int:  # i at the delimiter; returns the index after its close
        delim, i = script[i], i + 1
        while i < n and script[i] != delim:
            i += 2 if script[i] == "\\" else 1
        return i + 1

    def address(i: int) -> int:
        if i < n and script[i] == "/":
            return delimited(i)
        if script.startswith("\\", i) and i + 1 < n:
            return delimited(i + 1)
        while i < n and (script[i].isdigit() or script[i] in "$~+"):
            i += 1
        return i

    while i < n:
        while i < n and script[i] in " \t\n;{}!":
            i += 1
        if i >= n:
            break
        i = address(i)
        if i < n and script[i] == ",":
            i = address(i + 1)
        while i < n and script[i] in " \t!":
            i += 1
        if i >= n:
            break
        cmd = script[i]
        if cmd in "ewW":
            return f"sed's `{cmd}` command {'runs a command' if cmd == 'e' else 'writes a file'}"
        if cmd in "sy" and i + 1 < n:
            i = delimited(i + 1)
            i = delimited(i - 1)  # the replacement shares the delimiter
            start = i
            while i < n and script[i] not in ";\n}":
                i += 1
            flags = script[start:i]
            if cmd == "s" and ("e" in flags or "w" in flags):
                return "sed's `s///e` runs a command and `s///w` writes a file"
            continue
        if cmd in "aicrRbtT:#":  # text, file name, label or comment to the end of the line
            while i < n and script[i] != "\n":
                i += 1
            continue
        i += 1
    return None


# --- tar -----------------------------------------------------------------------------------

_TAR_RUNS = (
    "--checkpoint-action",
    "--to-command",
    "--use-compress-program",
    "--rsh-command",
    "--rmt-command",
    "--info-script",
    "--new-volume-script",
)


def _tar(args: Sequence[Word], depth: int) -> list[str]:
    for k, word in enumerate(args):
        t = word.text
        long = t.startswith("--") and t.split("=")[0] != "--checkpoint"
        bundle = t.startswith("-") and not t.startswith("--")
        old_style = k == 0 and t.isalpha()  # `tar cIf prog ...`
        if (
            (long and _abbreviates(t, _TAR_RUNS))
            or (bundle and any(c in t[1:] for c in "IF"))
            or (old_style and any(c in t for c in "IF"))
        ):
            raise refuse(f"`tar {t}` runs a program named in its options, which cannot be checked")
    return []


ESCAPE_CHECKS: dict[str, Callable[[Sequence[Word], int], list[str]]] = {
    "git": _git,
    "sed": _sed,
    "tar": _tar,
}
