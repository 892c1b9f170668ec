"""`coder mcp serve` has the walls of a run, tried with the real MCP client as a hostile client
would: its commands (shell_run, tests_run) cannot change the repository's `.git` (config,
hooks, refs, HEAD, the index; judged by hashing them and listing the refs with git before and
after each call), and what a call left running is gone when it returns (judged in /proc)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from pathlib import Path
from typing import Any

import pytest

from coder.policy import kernel
from tests.conftest import git
from tests.mcp.test_mcp_server import call, stdio_session, text

pytestmark = pytest.mark.skipif(
    not kernel.support().available,
    reason=f"no kernel sandbox here: {kernel.support().problem}",
)


def tree(root: Path) -> dict[str, str]:
    """Every entry under `root` (and `root` itself): its kind, mode and content hash, links by
    target, without following any."""
    out = {}
    for path in [root, *sorted(root.rglob("*"))]:
        info = path.lstat()
        if path.is_symlink():
            what = "-> " + str(path.readlink())
        elif path.is_file():
            what = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            what = "dir" if path.is_dir() else "other"
        out[str(path.relative_to(root))] = f"{info.st_mode:o} {what}"
    return out


def git_state(repo: Path) -> dict[str, Any]:
    """What a command must not change in the repository: every file of .git but the objects
    and logs (config, hooks, info, HEAD, refs, packed-refs, ...), the refs and HEAD as git
    reads them, what the index says (entries, stages and flags), and .git itself."""
    gitdir = repo / ".git"
    files = {
        rel: value
        for rel, value in tree(gitdir).items()
        if rel.split("/")[0] not in ("objects", "logs", "index")
    }
    return {
        "files": files,
        "refs": git(repo, "for-each-ref", "--format=%(refname) %(objectname) %(symref)"),
        "head": git(repo, "symbolic-ref", "HEAD") + git(repo, "rev-parse", "HEAD"),
        "stashes": git(repo, "stash", "list"),
        "index": git(repo, "ls-files", "--stage", "-v", "--debug"),
        "identity": (gitdir.lstat().st_ino, gitdir.lstat().st_dev),
    }


def without_times(index: str) -> str:
    """`git ls-files --debug` without the file times and sizes a `git status` refreshes."""
    keep = ("ctime:", "mtime:", "dev:", "size:")
    return "\n".join(line for line in index.splitlines() if not line.strip().startswith(keep))


def excluded(repo: Path) -> Path:
    """`repo` with `.coder/` excluded from git, as `coder mcp serve` leaves it when it starts
    (it makes `.coder/` before any command runs, as `coder init` does)."""
    with (repo / ".git" / "info" / "exclude").open("a") as exclude:
        exclude.write("/.coder/\n")
    return repo


def refused(result: Any) -> bool:
    """The call was stopped at a wall: the guard put .git back and said so (a tool error),
    or the sandbox's read-only .git refused the write (the command failed; `git stash` fails
    saying nothing)."""
    said = text(result)
    if result.is_error:
        return "it was put back as it was" in said or "coder dropped it" in said
    return bool(result.structured_content["exit_code"])


# Each attack on the repository, as a command a client may send through shell_run.
ATTACKS = {
    "a stash": "echo stashed >> README.md && git stash",
    # (`git config core.*` itself is refused by the command policy; a shell writes the file)
    "an fsmonitor in .git/config": "printf '[core]\\n\\tfsmonitor = echo pwned\\n' >> .git/config",
    "a pre-commit hook": "printf '#!/bin/sh\\necho hook\\n' > .git/hooks/pre-commit && "
    "chmod +x .git/hooks/pre-commit",
    "a sample hook made live": "chmod +x .git/hooks/pre-push.sample && "
    "mv .git/hooks/pre-push.sample .git/hooks/pre-push",
    "a commit onto main": "echo sneaky >> README.md && git commit -qam sneaky",
    "update-ref of main": "git update-ref refs/heads/main "
    "$(git commit-tree -m forged 'HEAD^{tree}')",
    "a new branch": "git branch side",
    "a tag": "git tag -a v9 -m 'release'",
    "HEAD moved to another branch": "git symbolic-ref HEAD refs/heads/elsewhere",
    "staged work": "echo new > staged.txt && git add staged.txt",
    "a change hidden from git status": "git update-index --skip-worktree README.md",
    "a forged MERGE_HEAD": "git rev-parse HEAD > .git/MERGE_HEAD",
    "packed refs": "git pack-refs --all",
    "an alias in info/": "echo '* filter=evil' > .git/info/attributes",
    "the hooks dir swapped for a link": "mv .git/hooks .git/hooks.away && ln -s {outside} "
    ".git/hooks",
    ".git itself replaced": "mv .git .git-away && git init -q . && "
    "printf '[core]\\n\\tfsmonitor = echo pwned\\n' >> .git/config",
}


@pytest.mark.parametrize("wall", ["read-only .git", "the guard alone"])
def test_shell_run_cannot_change_git(
    make_repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wall: str
) -> None:
    """Both walls, each on its own: the sandbox keeps .git read-only to the server's commands
    (where the machine has the mount wall), and the git guard puts back what a command
    changed there anyway (here with the sandbox off, as on a machine without one)."""
    guard_only = wall == "the guard alone" or kernel.support().mounts_problem is not None
    if wall == "the guard alone":
        user_config = tmp_path / "user-config.json"
        user_config.write_text('{"sandbox": "off"}')
        monkeypatch.setenv("CODER_CONFIG", str(user_config))
    repo = excluded(make_repo({"README.md": "# sample\n", "src/app.py": "x = 1\n"}))
    git(repo, "tag", "v1")  # a ref for pack-refs to move into packed-refs
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep\n")
    outside_before = tree(outside)
    before = git_state(repo)

    async def scenario() -> dict[str, Any]:
        results = {}
        async with stdio_session(repo, tmp_path / "server.err") as client:
            for name, cmd in ATTACKS.items():
                result = await call(client, "shell_run", cmd=cmd.replace("{outside}", str(outside)))
                results[name] = (result, git_state(repo))
            # an ordinary call is not an error: git refreshing the index's file times is no
            # change, and neither is writing a file of the checkout
            (repo / "README.md").touch()
            os.utime(repo / "README.md", (time.time() + 5, time.time() + 5))
            results["git status"] = await call(client, "shell_run", cmd="git status && git diff")
            results["fs_write"] = await call(client, "fs_write", path="new.txt", content="ok\n")
        return results

    results = asyncio.run(scenario())
    for name in ATTACKS:
        result, after = results[name]
        assert refused(result), (name, text(result))
        for key in ("files", "refs", "head", "stashes", "identity"):
            assert after[key] == before[key], (name, key)
        assert without_times(after["index"]) == without_times(before["index"]), name
    assert git_state(repo)["files"] == before["files"]
    assert tree(outside) == outside_before  # the restore never went through the link
    if guard_only:
        check_guard_messages(repo, results)
    for name in ("git status", "fs_write"):
        assert not results[name].is_error, (name, text(results[name]))
    assert (repo / "new.txt").read_text() == "ok\n"


def check_guard_messages(repo: Path, results: dict[str, Any]) -> None:
    """What the guard says when it put .git back: what changed, never a guess at the cause."""
    said = text(results["a commit onto main"][0])
    assert said.startswith("the command changed ") and ".git/refs/heads/main" in said
    assert "git commit" not in said.split("\n")[0]  # names what changed, not a guess
    assert ".git/config" in text(results["an fsmonitor in .git/config"][0])
    assert ".git/hooks/pre-commit" in text(results["a pre-commit hook"][0])
    assert ".git/index" in text(results["staged work"][0])
    assert "\nthe command added stash entry 'WIP on main: " in text(results["a stash"][0])
    aside = [p.name for p in repo.glob(".git.replaced-*")]  # the impostor, set aside
    assert len(aside) == 1
    assert (
        f"the command changed .git (moved away and replaced; the original is back, the "
        f"replacement is now {aside[0]})"
    ) in text(results[".git itself replaced"][0])
    # the checkout's files are the commands' to change: the commit's edit is still there
    assert (repo / "README.md").read_text() == "# sample\nsneaky\n"


def test_tests_run_cannot_change_git(make_repo, tmp_path: Path) -> None:
    repo = make_repo(
        {
            "coder.config.json": '{"test_command": "python -m pytest -q -p no:cacheprovider"}\n',
            "test_hook.py": "from pathlib import Path\n\n\ndef test_plants_a_hook():\n"
            "    hook = Path('.git/hooks/post-checkout')\n"
            "    hook.write_text('#!/bin/sh\\necho pwned\\n')\n    hook.chmod(0o755)\n",
        }
    )
    before = git_state(excluded(repo))

    async def scenario() -> Any:
        async with stdio_session(repo, tmp_path / "server.err") as client:
            return await call(client, "tests_run")

    result = asyncio.run(scenario())
    assert refused(result), text(result)
    assert ".git/hooks/post-checkout" in text(result) or "Read-only" in text(result)
    assert git_state(repo)["files"] == before["files"]
    assert not (repo / ".git" / "hooks" / "post-checkout").exists()


# Leaves its command's session (setsid) and says so in `ready`, then sleeps; the command ends
# only once it is out of reach of the process-group kill.
LEFTOVER = (
    'python3 -c \'import os, time; os.setsid(); open("ready", "w").close(); '
    "time.sleep(300)' coder-leftover-{marker} </dev/null >/dev/null 2>&1 & "
    "while [ ! -e ready ]; do sleep 0.05; done; echo left"
)


def processes_with(marker: str) -> list[int]:
    """Live processes whose command line carries `marker` (zombies count as gone)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry))
    return found


def test_a_leftover_process_is_ended_after_the_call(make_repo, tmp_path: Path) -> None:
    repo = make_repo()
    marker = f"{os.getpid()}-{time.monotonic_ns()}"

    async def scenario() -> tuple[Any, list[int]]:
        async with stdio_session(repo, tmp_path / "server.err") as client:
            result = await call(client, "shell_run", cmd=LEFTOVER.format(marker=marker))
            return result, processes_with(marker)  # the server is still up: nothing else ended it

    result, alive = asyncio.run(scenario())
    try:
        assert not result.is_error and "left" in text(result), text(result)
        assert (repo / "ready").exists()  # it did start, and left its session
        assert alive == []
    finally:
        for pid in processes_with(marker):
            os.kill(pid, 9)
