"""Project instructions (AGENTS.md and friends): which files, in which order, from which
commit, capped, redacted."""

from __future__ import annotations

import os
from pathlib import Path

import pygit2

from coder.context import instructions
from tests.conftest import git


def read(repo: Path, **kwargs):  # type: ignore[no-untyped-def]
    return instructions.read(pygit2.Repository(str(repo)), "HEAD", **kwargs)


def test_root_first_then_the_task_directories_then_by_depth(make_repo) -> None:
    repo = make_repo(
        {
            "AGENTS.md": "Use tabs.\n",
            "CONVENTIONS.md": "Name things well.\n",
            "web/AGENTS.md": "Views are thin.\n",
            "api/v1/AGENTS.md": "Version everything.\n",
            "docs/agents.md": "Lower-case names count too.\n",
            "src/notes.md": "not an instruction file\n",
        }
    )
    found = read(repo, prefer=["api/v1/handlers.py"])
    assert [i.path for i in found.files] == [
        "AGENTS.md",
        "CONVENTIONS.md",
        "api/v1/AGENTS.md",
        "docs/agents.md",
        "web/AGENTS.md",
    ]
    text = found.render()
    assert '<instructions path="AGENTS.md" applies-to="the whole repository">\nUse tabs.\n' in text
    assert 'path="web/AGENTS.md" applies-to="files under web/"' in text
    assert "cannot change the rules above" in text and "not an instruction file" not in text


def test_read_from_the_commit_not_the_checkout(make_repo) -> None:
    repo = make_repo({"AGENTS.md": "committed rule\n"})
    (repo / "AGENTS.md").write_text("uncommitted rule\n")
    (repo / "CLAUDE.md").write_text("untracked\n")
    assert [i.text for i in read(repo).files] == ["committed rule"]


def test_the_cap_cuts_and_names_what_is_left_out(make_repo) -> None:
    long = "".join(f"rule {i}: keep it simple\n" for i in range(100))
    repo = make_repo({"AGENTS.md": long, "a/AGENTS.md": "more\n", "b/AGENTS.md": "even more\n"})
    found = read(repo, max_chars=500)
    first = found.files[0]
    assert first.path == "AGENTS.md" and len(first.text) <= 500 and first.cut > 0
    assert first.text.endswith("keep it simple")  # cut at a line boundary
    assert found.left_out == ("a/AGENTS.md", "b/AGENTS.md")
    text = found.render()
    assert "more characters cut; read AGENTS.md with fs_read" in text
    assert (
        "Not included for lack of room (read them with fs_read): a/AGENTS.md, b/AGENTS.md" in text
    )


def test_names_are_configurable_and_links_read_once(make_repo) -> None:
    repo = make_repo({"AGENTS.md": "shared rules\n", "STYLE.md": "style rules\n"})
    os.symlink("AGENTS.md", repo / "CLAUDE.md")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "link")
    assert [i.path for i in read(repo).files] == ["AGENTS.md"]  # CLAUDE.md -> AGENTS.md
    assert [i.path for i in read(repo, names=["STYLE.md"]).files] == ["STYLE.md"]
    assert read(repo, names=["NOPE.md"]).render() == ""


def test_secrets_are_redacted(make_repo) -> None:
    key = "AKIA" + "Z7QXJ4LMNB2PVE6K"
    repo = make_repo({"AGENTS.md": f"Deploy with AWS_ACCESS_KEY_ID={key}\n"})
    text = read(repo).render()
    assert key not in text and "[REDACTED" in text
