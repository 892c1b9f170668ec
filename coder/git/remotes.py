"""Remotes: which there are, pushing to one with compare-and-swap, and a review page's URL.

Pushing runs the git program, never libgit2: credentials come from git's own credential
helpers, ssh agent and askpass, which coder never reads, asks for or stores. The program runs
in the user's environment less the `GIT_*` variables that would point it at another
repository, index or work tree (those that configure authentication stay). Without a
terminal to answer a prompt, git is told not to prompt (a CI job fails at once, not hangs).
Anything shown (a remote's URL, git's messages) has the URL's user and password cut out.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

from coder.errors import EnvironmentProblem, InvalidInput
from coder.git.repository import Repo

TIMEOUT_S = 600
# The GIT_* variables a push keeps: how git authenticates and which config it reads.
_KEPT = frozenset(
    {
        "GIT_ASKPASS",
        "GIT_SSH",
        "GIT_SSH_COMMAND",
        "GIT_SSH_VARIANT",
        "GIT_TERMINAL_PROMPT",
        "GIT_CONFIG_GLOBAL",
        "GIT_CONFIG_SYSTEM",
        "GIT_CONFIG_NOSYSTEM",
        "GIT_SSL_CAINFO",
        "GIT_SSL_CAPATH",
        "GIT_PROXY_COMMAND",
    }
)
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s]*@")


def remote_names(repo: Repo) -> list[str]:
    return sorted(n for n in repo.remotes.names() if n)


def remote_url(repo: Repo, name: str) -> str:
    """The push URL of remote `name`; InvalidInput naming the remotes there are."""
    names = remote_names(repo)
    if name not in names:
        there = (
            f"its remotes: {', '.join(names)}"
            if names
            else "it has none (add one with `git remote add NAME URL`)"
        )
        raise InvalidInput(f"this repository has no remote named {name!r}; {there}")
    remote = repo.remotes[name]
    return str(remote.push_url or remote.url or "")


def url_of(repo: Repo, remote: str) -> str:
    """`remote` as a URL another machine can use: a remote's name (its push URL), else as
    given; a local path made absolute (a worker clones it from elsewhere)."""
    url = remote_url(repo, remote) if remote in remote_names(repo) else remote
    if "://" in url or _SCP.match(url):
        return url
    return str((Path(repo.workdir or repo.path) / url).resolve())


def remote_urls(repo: Repo, name: str) -> list[str]:
    """Every URL remote `name` goes by: as configured (`remote.NAME.pushurl`, `.url`), then as
    git pushes to it (`url.X.insteadOf` applied). A review page is found from the first that
    names a known host: a URL rewritten to a mirror still opens the page of the one written."""
    remote_url(repo, name)
    found = [
        str(repo.config[key])
        for key in (f"remote.{name}.pushurl", f"remote.{name}.url")
        if key in repo.config
    ]
    remote = repo.remotes[name]
    found += [str(u) for u in (remote.push_url, remote.url) if u]
    return list(dict.fromkeys(found))


def default_remote(repo: Repo, base: str) -> str:
    """The remote `base` tracks (`branch.BASE.remote`), else `origin`."""
    key = f"branch.{base}.remote"
    if key in repo.config:
        return str(repo.config[key])
    return "origin"


def shown_url(url: str) -> str:
    """`url` (or any text holding URLs) without the user and password part."""
    return _USERINFO.sub(r"\1", url)


@dataclass(frozen=True)
class Pushed:
    """What git said of each ref: `refs/heads/x` -> (flag, summary), the porcelain's."""

    refs: dict[str, tuple[str, str]]
    ok: bool
    message: str  # git's last error line, user and password cut out

    def rejected(self, ref: str) -> bool:
        return self.refs.get(ref, ("", ""))[0] == "!"


def push(
    root: Path,
    remote: str,
    refspecs: list[str],
    *,
    lease: tuple[str, str] | None = None,
    atomic: bool = False,
) -> Pushed:
    """`git push --porcelain` of `refspecs` to `remote`; with `lease` (ref, expected sha; ""
    for "must not exist") the remote ref is replaced only if it is at `expected`."""
    args = ["push", "--porcelain"]
    if atomic:
        args.append("--atomic")
    if lease is not None:
        args.append(f"--force-with-lease={lease[0]}:{lease[1]}")
    proc = _git(root, *args, remote, *refspecs)
    refs: dict[str, tuple[str, str]] = {}
    for line in proc.stdout.splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and ":" in parts[1]:
            refs[parts[1].split(":", 1)[1]] = (parts[0], parts[2])
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    return Pushed(refs, proc.returncode == 0, shown_url(errors[-1] if errors else ""))


def remote_ref(root: Path, remote: str, ref: str) -> str | None:
    """Where `ref` is on `remote` now (None: it does not exist there)."""
    proc = _git(root, "ls-remote", "--refs", remote, ref)
    if proc.returncode != 0:
        detail = [line for line in proc.stderr.splitlines() if line.strip()]
        raise EnvironmentProblem(
            f"cannot read {ref} on remote {remote}: "
            f"{shown_url(detail[-1]) if detail else f'git exited {proc.returncode}'}"
        )
    for line in proc.stdout.splitlines():
        sha, _, name = line.partition("\t")
        if name == ref:
            return sha
    return None


def fetch(root: Path, remote: str, refspecs: list[str]) -> None:
    """`git fetch` of `refspecs` from `remote` into the repository at `root`
    (EnvironmentProblem with git's last line when it fails)."""
    _checked(_git(root, "fetch", "--no-tags", "--quiet", remote, *refspecs), f"fetch from {remote}")


def clone(url: str, into: Path) -> None:
    """A fresh clone of `url` at `into` (EnvironmentProblem when git cannot make one)."""
    _checked(_git(into.parent, "clone", "--quiet", url, str(into)), f"clone {url}")


def remote_refs(root: Path, remote: str, pattern: str) -> dict[str, str]:
    """The refs of `remote` matching `pattern` (`refs/coder/ID/*`): name -> sha."""
    proc = _checked(_git(root, "ls-remote", "--refs", remote, pattern), f"list {remote}'s refs")
    found = {}
    for line in proc.stdout.splitlines():
        sha, _, name = line.partition("\t")
        if name:
            found[name] = sha
    return found


def _checked(
    proc: subprocess.CompletedProcess[str], doing: str
) -> subprocess.CompletedProcess[str]:
    if proc.returncode != 0:
        detail = [line for line in proc.stderr.splitlines() if line.strip()]
        said = shown_url(detail[-1]) if detail else f"git exited {proc.returncode}"
        raise EnvironmentProblem(f"cannot {shown_url(doing)}: {said}")
    return proc


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") or k in _KEPT}
    if not sys.stdin.isatty():  # nobody to answer a username prompt
        env.setdefault("GIT_TERMINAL_PROMPT", "0")
    try:
        return subprocess.run(
            ["git", *args],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            errors="replace",
            check=False,
            timeout=TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvironmentProblem(f"git {args[0]} in {root} failed: {exc}") from None


# --- review pages ---------------------------------------------------------------------------

HOSTS = ("GitHub", "GitLab", "Gitea/Forgejo", "Bitbucket")
_KNOWN = {
    "github.com": "GitHub",
    "gitlab.com": "GitLab",
    "bitbucket.org": "Bitbucket",
    "codeberg.org": "Gitea/Forgejo",
    "gitea.com": "Gitea/Forgejo",
}
_SCP = re.compile(r"^(?:[^@/\s]+@)?([^:/\s]+):(?!//)(.+)$")


def web_location(url: str) -> tuple[str, str, str] | None:
    """(kind, web root `https://host[:port]`, project path) of a remote URL in the https,
    ssh:// or scp-like (`git@host:owner/repo.git`) form; None for a local path or a host of
    no known kind. The host names the kind (github.com, gitlab.com, bitbucket.org,
    codeberg.org, gitea.com, or a name holding gitlab, gitea or forgejo)."""
    if "://" in url:
        parts = urlsplit(url)
        if parts.scheme not in ("https", "http", "ssh", "git+ssh", "ssh+git") or not parts.hostname:
            return None
        host, path = parts.hostname, parts.path
        keep_port = parts.scheme in ("https", "http") and parts.port
        root = f"{'http' if parts.scheme == 'http' else 'https'}://{host}"
        root += f":{parts.port}" if keep_port else ""
    else:
        m = _SCP.match(url)
        if m is None:
            return None
        host, path = m.group(1), m.group(2)
        root = f"https://{host}"
    path = path.strip("/").removesuffix(".git").strip("/")
    kind = _KNOWN.get(host.lower()) or next((k for word, k in _WORDS if word in host.lower()), None)
    if kind is None or "/" not in path:
        return None
    return kind, root, path


_WORDS = (("gitlab", "GitLab"), ("gitea", "Gitea/Forgejo"), ("forgejo", "Gitea/Forgejo"))


def compare_url(urls: list[str], *, base: str, branch: str) -> str | None:
    """The page that opens a pull (merge) request of `branch` into `base` on the remote at
    the first of `urls` whose host is of a known kind; None when none is."""
    found = next(filter(None, map(web_location, urls)), None)
    if found is None:
        return None
    kind, root, path = found
    b, h = quote(base, safe="/"), quote(branch, safe="/")
    if kind == "GitHub":
        return f"{root}/{path}/compare/{b}...{h}?expand=1"
    if kind == "GitLab":
        return (
            f"{root}/{path}/-/merge_requests/new?merge_request%5Bsource_branch%5D="
            f"{quote(branch, safe='')}&merge_request%5Btarget_branch%5D={quote(base, safe='')}"
        )
    if kind == "Bitbucket":
        return (
            f"{root}/{path}/pull-requests/new?source={quote(branch, safe='')}"
            f"&dest={quote(base, safe='')}"
        )
    return f"{root}/{path}/compare/{b}...{h}"  # Gitea and Forgejo
