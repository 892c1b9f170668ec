"""Command allowlist (with bypass attempts), environment scrubbing and the path guard."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from coder.errors import InvalidInput, PolicyViolation
from coder.policy.commands import DEFAULT_ALLOWED_COMMANDS, NETWORK_PROGRAMS, Policy, check_command
from coder.policy.env import scrub_env
from coder.policy.paths import is_protected, resolve_in_root
from coder.policy.shellparse import programs_in

POLICY = Policy()
NET_OFF_CURL = "`curl` is a network program and the network is off"


# --- commands ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cmd",
    [
        "python -m pytest -q",
        "git status && git diff --stat",
        "make test 2>&1 | tee build.log",
        "cd sub && npm test -- --watch=false",
        'for f in *.py; do python3 -m py_compile "$f"; done',
        "if [ -f setup.py ]; then python setup.py check; else echo none; fi",
        "{ echo a; echo b; } > out.txt",
        "(cd src && go test ./...)",
        'echo "a; curl b"',  # quoted text is data, not a command
        "echo 'curl http://x | sh' && grep -n 'eval' *.py",
        'FOO=1 BAR="x y" pytest -q',
        "find . -name '*.pyc' -exec rm -f {} +",
        "ls | xargs -n1 -I{} cat {}",
        "timeout 5 python3 -c 'print(1)'",
        "bash -c 'echo hi && ls'",
        "cat <<EOF > notes.txt\ncurl is mentioned here\nEOF",
        "[[ -d build ]] || mkdir -p build",
        "echo $((1 + 2)) > n.txt",
        "echo $(date +%s) # curl in a comment",
        "/usr/bin/env python3 -V",
    ],
)
def test_allowed_commands_pass(cmd: str) -> None:
    check_command(cmd, POLICY)


@pytest.mark.parametrize(
    "cmd, programs",
    [
        ("echo a; curl b", ["echo", "curl"]),
        ("a && b || c | d & e\nf", ["a", "b", "c", "d", "e", "f"]),
        ("echo $(curl x) `wget y`", ["echo", "curl", "wget"]),
        ("cat <(curl x) >(nc y)", ["cat", "curl", "nc"]),
        ("bash -c 'curl x'", ["bash", "curl"]),
        (
            "env -i FOO=1 timeout -s KILL 5 nice -n 5 nohup curl",
            ["env", "timeout", "nice", "nohup", "curl"],
        ),
        ("find . -exec sh -c 'curl $1' _ {} \\; -print", ["find", "sh", "curl"]),
        ("xargs", ["xargs", "echo"]),
        ('echo "${X:-$(curl a)}"', ["echo", "curl"]),
        ("cat <<EOF\n$(curl z)\nEOF\nls", ["cat", "ls", "curl"]),
        ("cat <<'EOF'\n$(curl z)\nEOF\nls", ["cat", "ls"]),
        ("x=$(curl a)", ["curl"]),
        ("[[ -f x && -d y ]] && echo ok", ["echo"]),
        ("\\curl; \"cu\"rl; c''url", ["curl", "curl", "curl"]),
    ],
)
def test_programs_in_finds_every_program(cmd: str, programs: list[str]) -> None:
    assert programs_in(cmd) == programs


@pytest.mark.parametrize(
    "cmd",
    [
        "echo ok; curl http://example.com",
        "true && curl x",
        "false || curl x",
        "cat f | curl -d @- x",
        "sleep 1 & curl x",
        "echo $(curl x)",
        "echo `curl x`",
        'echo "$(echo \\"$(curl q)\\")"',
        "bash -c 'curl x'",
        'sh -c "curl x"',
        "bash -ec 'ls; bash -c \"curl x\"'",
        "env curl x",
        "env -u HOME -i FOO=1 curl x",
        "timeout 5 curl x",
        "xargs curl",
        "xargs -n 1 -P4 curl",
        "find . -exec curl {} ;",
        "find . -name x -execdir curl {} \\;",
        "/usr/bin/curl x",
        "./curl x",
        "FOO=1 curl x",
        "nohup nice curl x",
        "(curl x)",
        "{ curl x; }",
        "if true; then curl x; fi",
        "cat <(curl x)",
        "ls > $(curl x)",
        "echo \"${X:-'$(curl y)'}\"",
        "echo $(( $(curl x) + 1 ))",
        "cat <<EOF\n$(curl z)\nEOF",
        "trap 'curl x' EXIT",
        "command curl x",
        "exec curl x",
        "for x do curl y; done",
        "for ((i=0; i<1; i++)) { curl x; }",
        "echo $[1<<2]\ncurl x",  # `<<` in $[...] is a shift, not a here-document
        "echo $[ $(curl x) ]",
        "cat <<EOF\nEO\\\nF\ncurl x\nEOF",  # bash joins `EO\` + `F` into the delimiter
    ],
)
def test_network_program_bypass_attempts_are_refused(cmd: str) -> None:
    with pytest.raises(PolicyViolation) as err:
        check_command(cmd, POLICY)
    assert NET_OFF_CURL in err.value.message
    assert (
        "set allow_network: true and add it to allowed_commands in coder.config.json"
        in err.value.message
    )


@pytest.mark.parametrize(
    "cmd, expected",
    [
        ("eval 'ls'", "`eval` runs a string as code, which cannot be checked"),
        ("ls; source env.sh", "`source` runs a file as code"),
        (". ./env.sh", "`.` (source) runs a file as code"),
        ("echo 'unterminated", "unbalanced single quote"),
        ('echo "unterminated', "unbalanced double quote"),
        ("echo `unterminated", "unbalanced backtick"),
        ("(ls", "unbalanced parentheses"),
        ("echo $(ls", "unbalanced parentheses"),
        ("ls)", "unbalanced parentheses"),
        ("$CMD args", "the program `$CMD` is given by a variable or substitution"),
        ("${CMD} args", "the program `${CMD}` is given by a variable"),
        ("$(which curl) x", "is given by a variable or substitution"),
        ("$'\\x63url' x", "is given by a variable or substitution"),
        ("env $PROG x", "the program `$PROG` is given by a variable"),
        ('bash -c "$SCRIPT"', "the script of `-c` is built at run time"),
        ("{curl,x} y", "the program `{curl,x}` is a pattern the shell would expand"),
        ("/usr/bin/cu* x", "is a pattern the shell would expand"),
        ("bash script.sh", "a shell may only run as `bash -c '<script>'`"),
        ("echo curl x | sh", "a shell may only run as `bash -c '<script>'`"),
        ("f() { ls; }; f", "function definitions and array assignments are not supported"),
        ("case x in a) ls;; esac", "`case` is not supported"),
        ("env -S 'curl x'", "`env -S` splits a string into a command"),
        ("PS4='$(curl x)' bash -xc true", "setting PS4 can make the shell run commands"),
        ("export BASH_ENV=./x.sh; bash -c true", "setting BASH_ENV"),
        ("cp /usr/bin/id cat; PATH=.:$PATH cat x", "setting PATH can make the shell run"),
        ("export PATH=.:$PATH; cat x", "setting PATH"),
        ("env PATH=bin cat x", "setting PATH"),
        ("cat <<$X\nbody\n$X\ncurl x", "a here-document delimiter must be a plain word"),
        ("echo curl x | xargs env", "`xargs env` would take the program to run from its input"),
        ("xargs -n1 timeout 5", "`xargs timeout` would take the program to run from its input"),
        ("xargs find .", "`xargs find` would take the program to run from its input"),
        ("echo " + "$(" * 5000 + ")" * 5000, "substitutions are nested too deeply to check"),
        (
            "docker run x",
            "`docker` is not in allowed_commands (add it to allowed_commands in coder.config.json)",
        ),
        ("sudo ls", "`sudo` is not in allowed_commands"),
    ],
)
def test_uncheckable_or_unlisted_commands_are_refused(cmd: str, expected: str) -> None:
    with pytest.raises(PolicyViolation) as err:
        check_command(cmd, POLICY)
    assert err.value.message.startswith("command refused: ")
    assert expected in err.value.message
    assert isinstance(err.value, InvalidInput)


def test_network_programs_need_allow_network_and_the_allowlist() -> None:
    listed = Policy(allowed_commands=POLICY.allowed_commands | {"curl"})
    with pytest.raises(
        PolicyViolation,
        match="network is off \\(set allow_network: true in coder.config.json to allow it\\)",
    ):
        check_command("curl http://x", listed)  # listed, but the network is off
    check_command(
        "curl http://x | sh -c 'cat'",
        Policy(allowed_commands=listed.allowed_commands, allow_network=True),
    )
    with pytest.raises(PolicyViolation, match="`curl` is not in allowed_commands"):
        check_command("curl http://x", Policy(allow_network=True))
    assert not NETWORK_PROGRAMS & set(DEFAULT_ALLOWED_COMMANDS)


def test_policy_from_config_extends_defaults() -> None:
    policy = Policy.from_config(
        {
            "allowed_commands": ["docker", "/usr/local/bin/just"],
            "allow_network": True,
            "env_passthrough": ["MY_TOKEN"],
            "protected_paths": ["vendor/"],
            "command_timeout": 30,
            "output_cap": 2048,
            "model": "ignored",
        }
    )
    assert {"docker", "just", "python", "git"} <= policy.allowed_commands
    assert policy.allow_network and policy.env_passthrough == {"MY_TOKEN"}
    assert policy.protected_paths == ("vendor/",)
    assert (policy.command_timeout, policy.output_cap) == (30, 2048)
    assert Policy.from_config({}) == Policy()
    with pytest.raises(InvalidInput, match="allowed_commands must be a list of strings"):
        Policy.from_config({"allowed_commands": "docker"})
    with pytest.raises(InvalidInput, match="command_timeout must be an integer >= 1"):
        Policy.from_config({"command_timeout": 0})


# --- environment ---------------------------------------------------------------------------

BASE_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/home/u",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "FAKE_API_KEY": "sk-123",
    "GITHUB_TOKEN": "ghp_abc",
    "DB_PASSWORD": "hunter2",
    "AWS_SECRET_ACCESS_KEY": "x",
    "npm_config_authtoken": "x",
    "RANDOM_APP_SETTING": "1",
    "BASH_ENV": "/tmp/evil.sh",
    "LD_PRELOAD": "/tmp/evil.so",
}


def test_scrub_env_keeps_basics_and_drops_secrets() -> None:
    env = scrub_env(POLICY.env_passthrough, base=BASE_ENV)
    assert env == {
        "PATH": "/usr/bin:/bin",
        "HOME": "/home/u",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "GIT_TERMINAL_PROMPT": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def test_scrub_env_honours_passthrough_and_extra() -> None:
    policy = Policy(env_passthrough=frozenset({"GITHUB_TOKEN", "NOT_SET"}))
    env = scrub_env(policy.env_passthrough, extra={"MODE": "ci", "PATH": "/opt/bin"}, base=BASE_ENV)
    assert env["GITHUB_TOKEN"] == "ghp_abc"
    assert env["MODE"] == "ci" and env["PATH"] == "/opt/bin"  # extra applies last
    assert "NOT_SET" not in env and "FAKE_API_KEY" not in env and "DB_PASSWORD" not in env


def test_scrub_env_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_API_KEY", "sk-live-123")
    env = scrub_env(POLICY.env_passthrough)
    assert "FAKE_API_KEY" not in env and env["PATH"] == os.environ["PATH"]


# --- paths ---------------------------------------------------------------------------------


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "wt"
    (root / "src").mkdir(parents=True)
    (root / "README.md").write_text("# hi\n")
    (root / ".git").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("x")
    return root


def test_reads_and_writes_inside_the_root(root: Path) -> None:
    real = Path(os.path.realpath(root))
    assert resolve_in_root(root, "README.md", write=False, policy=POLICY) == real / "README.md"
    assert (
        resolve_in_root(root, "src/new/file.py", write=True, policy=POLICY)
        == real / "src" / "new" / "file.py"
    )
    assert (
        resolve_in_root(root, "src/../README.md", write=True, policy=POLICY) == real / "README.md"
    )
    assert resolve_in_root(root, str(root / "src"), write=False, policy=POLICY) == real / "src"
    assert resolve_in_root(root, ".git/config", write=False, policy=POLICY)  # reading is fine


@pytest.mark.parametrize(
    "rel", ["../outside/secret.txt", "../../etc/passwd", "src/../../x", "/etc/passwd"]
)
def test_paths_leaving_the_root_are_refused(root: Path, rel: str) -> None:
    for write in (False, True):
        with pytest.raises(PolicyViolation) as err:
            resolve_in_root(root, rel, write=write, policy=POLICY)
        assert err.value.message == f"path escapes the worktree: {rel}"


def test_symlink_escapes_are_refused(root: Path) -> None:
    outside = root.parent / "outside"
    (root / "link.txt").symlink_to(outside / "secret.txt")
    (root / "linkdir").symlink_to(outside, target_is_directory=True)
    (root / "dangling").symlink_to(outside / "not-yet")
    for rel in ("link.txt", "linkdir/secret.txt", "linkdir/new/file.py", "dangling"):
        with pytest.raises(PolicyViolation) as err:
            resolve_in_root(root, rel, write=True, policy=POLICY)
        assert err.value.message.startswith(
            f"path escapes the worktree through a symlink: {rel} -> {os.path.realpath(outside)}"
        )


@pytest.mark.parametrize(
    "rel, reason",
    [
        (".git/config", ".git belongs to coder's executor"),
        (".git/hooks/pre-commit", ".git belongs to coder's executor"),
        ("sub/.git/HEAD", ".git belongs to coder's executor"),
        (".coder/x", ".coder holds coder's own state"),
        (".env", "it looks like a secrets file (matches .env)"),
        ("app/.env.local", "it looks like a secrets file (matches .env.*)"),
        ("key.pem", "matches *.pem"),
        ("certs/server.key", "matches *.key"),
        ("my_secret.txt", "matches *secret*"),
        ("config/Secrets/db.yml", "matches *secret*"),
        ("id_rsa.pub", "matches id_rsa*"),
        ("vendor/lib.py", "it matches protected_paths glob 'vendor/' in coder.config.json"),
        ("migrations/0001.sql", "it matches protected_paths glob '*.sql'"),
    ],
)
def test_protected_paths_are_not_written(root: Path, rel: str, reason: str) -> None:
    policy = Policy(protected_paths=("vendor/", "*.sql"))
    with pytest.raises(PolicyViolation) as err:
        resolve_in_root(root, rel, write=True, policy=policy)
    assert err.value.message.startswith(f"refusing to write {rel}: ")
    assert reason in err.value.message
    resolve_in_root(root, rel, write=False, policy=policy)  # reading is the redactor's business


def test_symlink_into_git_is_protected(root: Path) -> None:
    (root / "innocent").symlink_to(root / ".git", target_is_directory=True)
    with pytest.raises(PolicyViolation, match="refusing to write innocent/config: .git belongs"):
        resolve_in_root(root, "innocent/config", write=True, policy=POLICY)


def test_is_protected() -> None:
    assert is_protected("src/app.py", POLICY) is None
    assert is_protected(".envrc.example.md", POLICY) is None
    assert (
        is_protected("docs/.env.example", POLICY) == "it looks like a secrets file (matches .env.*)"
    )
    assert is_protected("./.GIT/config", POLICY) == ".git belongs to coder's executor"


# --- programs resolve, and allowed programs cannot run others -------------------------------


@pytest.mark.parametrize(
    "cmd, why",
    [
        ("git -c alias.x='!whoami > f' x", "`git -c` overrides git's configuration"),
        ("git -c core.pager=whoami log", "`git -c` overrides git's configuration"),
        ("git --config-env=core.editor=E commit", "`git --config-env=core.editor=E` overrides"),
        ("git config alias.x '!whoami'", "`git config alias.*` / `core.*`"),
        ("git fetch --upload-pack=whoami origin", "runs a program named in its options"),
        ("git clone -u whoami src dst", "`git clone -u` runs a program"),
        ("git rebase -x whoami main", "`git rebase -x` runs a program"),
        ("git submodule foreach whoami", "`git submodule` runs commands given to it"),
        ("GIT_CONFIG_COUNT=1 git status", "setting GIT_CONFIG_COUNT"),
        ("HOME=. git status", "setting HOME"),  # git would read ./.gitconfig (aliases)
        ("export BASH_ENV=./x.sh; bash -c true", "setting BASH_ENV"),
        ("LD_PRELOAD=./x.so cat f", "setting LD_PRELOAD"),
        ("sed -n '1e whoami' f", "sed's `e` command runs a command"),
        ("sed 's/a/b/e' f", "`s///e` runs a command"),
        ("sed -e p -e '/x/w out' f", "sed's `w` command writes a file"),
        ("sed -f script.sed f", "`sed -f` reads its script from a file"),
        ("tar --checkpoint=1 --checkpoint-action=exec=whoami -cf x.tar .", "`tar --checkpoint-act"),
        ("tar --to-command=whoami -xf x.tar", "`tar --to-command=whoami` runs a program"),
        ("tar -I whoami -cf x.tar .", "`tar -I` runs a program"),
        ("find . -exec whoami \\;", "`whoami` is not in allowed_commands"),
        ("ls | xargs whoami", "`whoami` is not in allowed_commands"),
        ("env FOO=1 nice -n 5 timeout 5 whoami", "`whoami` is not in allowed_commands"),
    ],
)
def test_exec_escapes_of_allowed_programs_are_refused(cmd: str, why: str) -> None:
    with pytest.raises(PolicyViolation) as err:
        check_command(cmd, POLICY)
    assert why in err.value.message


@pytest.mark.parametrize(
    "cmd",
    [
        "git log --oneline -5 && git diff --stat",
        "git -C sub status",
        "git add -u",
        "sed -i 's/we/they/g; s/a/b/' f",
        "sed -n '1,5p;/^#/d' f",
        "tar -czf out.tgz src && tar xzf out.tgz",
        "tar --checkpoint=100 -cf x.tar .",
    ],
)
def test_everyday_uses_of_those_programs_pass(cmd: str) -> None:
    check_command(cmd, POLICY)


def test_programs_resolve_to_what_path_finds(tmp_path: Path) -> None:
    root = tmp_path / "wt"
    (root / "tools").mkdir(parents=True)
    (root / "tools" / "build.sh").write_text("#!/bin/sh\n")
    path = os.environ["PATH"]

    def check(cmd: str, policy: Policy = POLICY) -> None:
        check_command(cmd, policy, root=root, cwd=root, path=path)

    cat = os.path.realpath(str(shutil.which("cat", path=path)))
    check("cat a.txt")
    check(f"{cat} a.txt")  # the very file `cat` finds on PATH
    for cmd in ("cp /usr/bin/whoami ./cat && ./cat", "sub/../cat", f"{root}/cat"):
        with pytest.raises(PolicyViolation, match="is a program inside the worktree"):
            check(cmd)
    by_name = Policy.from_config({"allowed_commands": ["build.sh"]})
    with pytest.raises(PolicyViolation, match=r"add `\./tools/build.sh` to allowed_commands"):
        check("./tools/build.sh", by_name)
    check("./tools/build.sh", Policy.from_config({"allowed_commands": ["./tools/build.sh"]}))
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(PolicyViolation, match="is not the `cat` allowed commands run"):
        check(f"{tmp_path}/elsewhere/cat")
    with pytest.raises(PolicyViolation, match="would run .*inside the worktree"):
        (root / "bin").mkdir()
        (root / "bin" / "ls").write_text("")
        (root / "bin" / "ls").chmod(0o755)
        check_command("ls", POLICY, root=root, cwd=root, path=f"{root}/bin:{path}")


def test_a_builtin_runs_as_a_builtin_whatever_path_finds(tmp_path: Path) -> None:
    """bash runs `echo` itself even where PATH finds an `echo` file in the worktree (so it is
    not looked up at all); the file run by its path is still a program inside the worktree."""
    root = tmp_path / "wt"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "echo").write_text("#!/bin/sh\n")
    (root / "bin" / "echo").chmod(0o755)
    path = f"{root}/bin:{os.environ['PATH']}"
    check_command("echo hi > out.txt", POLICY, root=root, cwd=root, path=path)
    with pytest.raises(PolicyViolation, match="is a program inside the worktree"):
        check_command("bin/echo hi", POLICY, root=root, cwd=root, path=path)
