"""`coder push` and `coder merge --push` against a real bare remote (`git init --bare`), checked
with the git CLI: the branch lands, a later push after a new step replaces only what coder
pushed, someone else's push to the branch makes coder refuse with the remote unchanged, the
report is the pull request's body, and the compare URL of each host kind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from coder.git.remotes import compare_url, shown_url, web_location
from tests.conftest import coder, git
from tests.helpers import state_of, taskfile

TASK = """
    id: pr
    title: Push demo
    graph:
      - {id: s1, kind: shell, cmd: "echo one > a.txt"}
      - {id: s2, kind: shell, cmd: "STEP2", depends_on: [s1]}
"""
BRANCH = "agent/pr-push-demo"
REF = f"refs/heads/{BRANCH}"


def remote_ref(remote: Path, ref: str) -> str | None:
    out = git(remote, "ls-remote", str(remote), ref)
    return out.split("\t")[0] if out else None


def rev(repo: Path, what: str) -> str:
    return git(repo, "rev-parse", what).strip()


@pytest.fixture
def setup(make_repo: Any, tmp_path: Path) -> tuple[Path, Path, Path]:
    return run_with_remote(make_repo, tmp_path)


def run_with_remote(make_repo: Any, tmp_path: Path) -> tuple[Path, Path, Path]:
    """A repository whose run `pr` stopped at a failing s2 (s1 committed), and a bare remote
    `origin` known by a GitHub URL that git rewrites to the bare one (`insteadOf`)."""
    repo = make_repo({"README.md": "# p\n"})
    remote = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", str(remote))
    git(repo, "push", "-q", str(remote), "main")
    git(repo, "remote", "add", "origin", "https://github.com/acme/widgets.git")
    git(repo, "config", f"url.{remote}.insteadOf", "https://github.com/acme/widgets.git")
    path = taskfile(repo, TASK.replace("STEP2", "exit 1"))
    code, out, err = coder(repo, "run", "--autonomous", "-f", str(path))
    assert code == 1, out + err
    return repo, remote, path


def test_push_creates_the_branch_writes_the_body_and_prints_the_compare_url(
    setup: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    repo, remote, _ = setup
    assert remote_ref(remote, REF) is None
    body = tmp_path / "pr.md"
    code, out, err = coder(repo, "push", "-t", "pr", "-o", str(body))
    assert code == 0, out + err
    tip = rev(repo, BRANCH)
    assert remote_ref(remote, REF) == tip
    assert f"{BRANCH} pushed at {tip[:12]} on origin" in out
    assert (
        "open the pull request: https://github.com/acme/widgets/compare/main..."
        f"{BRANCH}?expand=1" in out
    )
    assert "run pr is failed" in out
    text = body.read_text()
    assert text.startswith("# Push demo") and "s1" in text
    pushed = state_of(repo, "pr")["pushed"]
    assert pushed["commit"] == tip and pushed["remote"] == "origin" and pushed["ref"] == REF

    # without -o the body is stdout's (so `> pr.md` works) and the rest stderr's
    code, out, err = coder(repo, "push", "-t", "pr")
    assert code == 0, out + err
    assert out == text and "already there" in err


def test_a_second_push_after_a_new_step_replaces_what_coder_pushed(
    setup: tuple[Path, Path, Path],
) -> None:
    repo, remote, path = setup
    code, out, err = coder(repo, "push", "-t", "pr", "--json")
    assert code == 0, out + err
    first = json.loads(out)
    assert first["outcome"] == "pushed" and first["previous"] is None
    path.write_text(path.read_text().replace("exit 1", "echo two > b.txt"))
    code, out, err = coder(repo, "resume", "-t", "pr", "--taskfile")
    assert code == 0, out + err
    tip = rev(repo, BRANCH)
    assert tip != first["commit"]
    code, out, err = coder(repo, "push", "-t", "pr", "--json")
    assert code == 0, out + err
    second = json.loads(out)
    assert second["previous"] == first["commit"] and second["commit"] == tip
    assert remote_ref(remote, REF) == tip
    assert "run pr is" not in "".join(second["warnings"])  # it succeeded


def test_push_refuses_a_branch_someone_else_moved_and_leaves_it(
    setup: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    repo, remote, _ = setup
    code, out, err = coder(repo, "push", "-t", "pr")
    assert code == 0, out + err
    ours = rev(repo, BRANCH)
    other = tmp_path / "other"
    git(tmp_path, "clone", "-q", "-b", BRANCH, str(remote), str(other))
    (other / "theirs.txt").write_text("theirs\n")
    git(other, "add", "theirs.txt")
    git(other, "commit", "-q", "-m", "someone else's work")
    git(other, "push", "-q", "origin", BRANCH)
    theirs = rev(other, "HEAD")
    record = state_of(repo, "pr")["pushed"]

    code, out, err = coder(repo, "push", "-t", "pr")
    assert code == 3, out + err
    assert f"is at {theirs[:12]}, and coder last pushed {ours[:12]} there" in err
    assert "refusing to overwrite it" in err and "Traceback" not in err
    assert remote_ref(remote, REF) == theirs
    assert state_of(repo, "pr")["pushed"] == record


def test_push_refuses_a_branch_it_never_pushed(
    setup: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    repo, remote, _ = setup
    git(repo, "push", "-q", str(remote), f"main:{REF}")  # someone took the name first
    code, out, err = coder(repo, "push", "-t", "pr")
    assert code == 3, out + err
    assert "coder never pushed that branch there" in err
    assert remote_ref(remote, REF) == rev(repo, "main")
    assert state_of(repo, "pr")["pushed"] is None


def test_push_to_a_remote_that_is_not_there_names_those_that_are(
    setup: tuple[Path, Path, Path],
) -> None:
    repo, remote, _ = setup
    git(repo, "remote", "add", "backup", str(remote))
    code, out, err = coder(repo, "push", "-t", "pr", "--remote", "upstream")
    assert code == 2
    assert "no remote named 'upstream'; its remotes: backup, origin" in err
    assert remote_ref(remote, REF) is None
    code, out, err = coder(repo, "push", "-t", "pr", "--remote", "backup")
    assert code == 0, out + err
    assert "no pull request page" in err  # a path: no host to open a pull request on


def test_merge_push_lands_main_and_the_tag_on_the_remote(
    setup: tuple[Path, Path, Path],
) -> None:
    repo, remote, path = setup
    path.write_text(path.read_text().replace("exit 1", "echo two > b.txt"))
    code, out, err = coder(repo, "resume", "-t", "pr", "--taskfile")
    assert code == 0, out + err
    code, out, err = coder(repo, "merge", "-t", "pr", "--push", "--remote", "nope")
    assert code == 2 and "no remote named 'nope'" in err
    assert state_of(repo, "pr")["merge"] is None  # refused before anything landed
    code, out, err = coder(repo, "merge", "-t", "pr", "--push")
    assert code == 0, out + err
    assert "pushed main" in out and "tag coder/pr to origin" in out
    assert remote_ref(remote, "refs/heads/main") == rev(repo, "main")
    assert remote_ref(remote, "refs/tags/coder/pr") == rev(repo, "refs/tags/coder/pr")
    assert git(remote, "show", "main:b.txt") == "two\n"


def test_push_refuses_while_the_run_runs(
    setup: tuple[Path, Path, Path],
) -> None:
    from coder.run.lock import TaskLock

    repo, remote, _ = setup
    with TaskLock(repo / ".coder", "pr"):
        code, _, err = coder(repo, "push", "-t", "pr")
    assert code == 3 and "cannot push run pr while it runs" in err
    assert remote_ref(remote, REF) is None


def test_a_push_whose_record_was_lost_finds_its_branch_there(
    setup: tuple[Path, Path, Path],
) -> None:
    """The push landed but the state kept no record of it (a kill in between): the remote
    branch is at the run's tip, so that is coder's and the push says it is already there."""
    repo, remote, _ = setup
    git(repo, "push", "-q", str(remote), f"{BRANCH}:{REF}")
    code, out, err = coder(repo, "push", "-t", "pr", "--json")
    assert code == 0, out + err
    assert json.loads(out)["outcome"] == "up_to_date"
    assert state_of(repo, "pr")["pushed"]["commit"] == rev(repo, BRANCH)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "https://github.com/acme/widgets.git",
            "https://github.com/acme/widgets/compare/main...agent/x-1?expand=1",
        ),
        (
            "git@github.com:acme/widgets.git",
            "https://github.com/acme/widgets/compare/main...agent/x-1?expand=1",
        ),
        (
            "ssh://git@github.com/acme/widgets",
            "https://github.com/acme/widgets/compare/main...agent/x-1?expand=1",
        ),
        (
            "https://gitlab.com/group/sub/widgets.git",
            "https://gitlab.com/group/sub/widgets/-/merge_requests/new?merge_request%5B"
            "source_branch%5D=agent%2Fx-1&merge_request%5Btarget_branch%5D=main",
        ),
        (
            "git@gitlab.example.org:team/widgets.git",
            "https://gitlab.example.org/team/widgets/-/merge_requests/new?merge_request%5B"
            "source_branch%5D=agent%2Fx-1&merge_request%5Btarget_branch%5D=main",
        ),
        (
            "https://codeberg.org/acme/widgets.git",
            "https://codeberg.org/acme/widgets/compare/main...agent/x-1",
        ),
        (
            "ssh://git@gitea.example.com:2222/acme/widgets.git",
            "https://gitea.example.com/acme/widgets/compare/main...agent/x-1",
        ),
        (
            "https://forgejo.example.com:3000/acme/widgets",
            "https://forgejo.example.com:3000/acme/widgets/compare/main...agent/x-1",
        ),
        (
            "https://user@bitbucket.org/acme/widgets.git",
            "https://bitbucket.org/acme/widgets/pull-requests/new?source=agent%2Fx-1&dest=main",
        ),
        (
            "git@bitbucket.org:acme/widgets.git",
            "https://bitbucket.org/acme/widgets/pull-requests/new?source=agent%2Fx-1&dest=main",
        ),
        ("https://git.example.com/acme/widgets.git", None),
        ("/srv/git/widgets.git", None),
        ("file:///srv/git/widgets.git", None),
    ],
)
def test_compare_url_of_each_host_kind(url: str, expected: str | None) -> None:
    assert compare_url([url], base="main", branch="agent/x-1") == expected


def test_a_known_url_after_an_unknown_one_still_gives_the_page() -> None:
    urls = ["/mirror/widgets.git", "git@github.com:acme/widgets.git"]
    assert compare_url(urls, base="main", branch="b") == (
        "https://github.com/acme/widgets/compare/main...b?expand=1"
    )
    assert web_location("https://github.com/acme") is None  # no project path


def test_shown_urls_lose_their_user_and_password() -> None:
    assert shown_url("https://bob:s3cret@github.com/a/b.git") == "https://github.com/a/b.git"
    assert shown_url("fatal: unable to access 'https://x:tok@host/r/'") == (
        "fatal: unable to access 'https://host/r/'"
    )
    assert shown_url("git@github.com:a/b.git") == "git@github.com:a/b.git"
