"""coder.git.objects: the objects of a commit coder writes are held in a kept pack until a ref
reaches the commit, so a `git gc --prune=now` in between takes none of them; the packs are
git's format, rolled up as they pile up; a dead coder's `.keep` files are swept. Judged by the
git CLI (`cat-file`, `verify-pack`, `fsck`) after a real `git gc`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pygit2
import pytest

from coder.errors import ObjectsMissing
from coder.files import owner
from coder.git import branches, commits, objects, repository, staging
from tests.conftest import git


def gc(repo: Path) -> None:
    git(repo, "gc", "-q", "--prune=now", "--aggressive")


def exists(repo: Path, oid: str) -> bool:
    return subprocess.run(["git", "cat-file", "-e", oid], cwd=repo, check=False).returncode == 0


def loose(repo: Path) -> list[Path]:
    return list((repo / ".git" / "objects").glob("??/*"))


def keeps(repo: Path) -> list[str]:
    return sorted(p.name for p in (repo / ".git" / "objects" / "pack").glob("*.keep"))


def new_commit(repo: Path, text: str) -> tuple[pygit2.Repository, pygit2.Oid, list[str]]:
    """A commit on no ref whose tree adds `new/<text>.txt` to main's, held (write_commit)."""
    w = repository.open_repo(repo)
    parent = w.revparse_single("main").peel(pygit2.Commit)
    blob = w.create_blob(f"{text}\n".encode())
    sub = w.TreeBuilder()
    sub.insert(f"{text}.txt", blob, pygit2.enums.FileMode.BLOB)
    top = w.TreeBuilder(parent.tree)
    top.insert("new", sub.write(), pygit2.enums.FileMode.TREE)
    tree = top.write()
    brought = staging.brings(w, parent.tree_id, tree)
    who = repository.identity(w)
    oid = commits.write_commit(w, who.author, who.committer, text, tree, [parent.id], brought)
    return w, oid, brought


def test_a_held_commit_survives_git_gc_prune_now_until_a_ref_reaches_it(make_repo) -> None:
    repo = make_repo({"a.txt": "a\n"})
    w, oid, brought = new_commit(repo, "held")
    assert len(brought) == 3  # the tree, the new subtree, the blob
    assert keeps(repo) and all(
        (repo / ".git/objects/pack" / k).read_text() == f"coder {owner.tag()}\n"
        for k in keeps(repo)
    )
    gc(repo)  # nothing reaches them: without the kept pack, all four would go
    assert all(exists(repo, o) for o in [str(oid), *brought])

    main = branches.branch_tip(w, "main")
    assert main is not None
    branches.move_branch_ref(w, "refs/heads/main", oid, main, repo, "test")
    assert keeps(repo) == []  # released: a ref reaches them now
    gc(repo)
    assert all(exists(repo, o) for o in [str(oid), *brought])
    git(repo, "fsck", "--strict", "--no-dangling")


def test_what_no_ref_reached_goes_with_the_next_prune_once_released(make_repo) -> None:
    repo = make_repo({"a.txt": "a\n"})
    _, oid, brought = new_commit(repo, "abandoned")
    objects._release_all()  # what coder does at exit
    assert keeps(repo) == []
    gc(repo)
    assert not any(exists(repo, o) for o in [str(oid), *brought])


def test_a_missing_object_is_refused_and_nothing_is_held(make_repo) -> None:
    repo = make_repo({"a.txt": "a\n"})
    w = repository.open_repo(repo)
    parent = w.revparse_single("main").peel(pygit2.Commit)
    who = repository.identity(w)
    gone = "1" * 40
    with pytest.raises(ObjectsMissing, match="1111111111") as caught:
        commits.write_commit(w, who.author, who.committer, "m", parent.tree_id, [parent.id], [gone])
    assert caught.value.oids == {gone}
    assert keeps(repo) == []


def test_the_packs_are_gits_and_are_rolled_up_as_they_pile_up(make_repo) -> None:
    repo = make_repo({"a.txt": "a\n"})
    w = repository.open_repo(repo)
    made = []
    for n in range(3 * objects._FAN_IN + 4):
        _, oid, brought = new_commit(repo, f"c{n}")
        tip = branches.branch_tip(w, "main")
        assert tip is not None
        branches.move_branch_ref(w, "refs/heads/main", oid, tip, repo, "test")
        made += [str(oid), *brought]
        if n == objects._FAN_IN + 2:
            git(repo, "repack", "-adq")  # git's own roll-up takes some of coder's packs away
    packs = list((repo / ".git" / "objects" / "pack").glob("*.idx"))
    assert len(packs) <= objects._FAN_IN, len(packs)  # rolled up as they pile up
    for idx in packs:
        git(repo, "verify-pack", str(idx))
    git(repo, "prune-packed")  # every loose copy is in a pack of coder's
    assert all(exists(repo, o) for o in made)
    git(repo, "fsck", "--strict", "--no-dangling")


def test_the_same_commit_in_two_repositories_is_held_and_released_in_each(make_repo) -> None:
    """One process, two repositories, the same commit in both (same tree, parents, identity
    and second, as two runs of one taskfile make): a ref reaching it in one releases only that
    one's pack, and that repository's roll-ups never take the other's."""
    repos = [make_repo({"a.txt": "a\n"}, name=name) for name in ("one", "two")]
    opened = [repository.open_repo(r) for r in repos]
    who = pygit2.Signature("T", "t@example.com", 1_700_000_000, 0)

    def held(w: pygit2.Repository, text: str) -> pygit2.Oid:
        blob = w.create_blob(text.encode())
        top = w.TreeBuilder()
        top.insert("f.txt", blob, pygit2.enums.FileMode.BLOB)
        tree = top.write()
        return commits.write_commit(w, who, who, text, tree, [], [str(tree), str(blob)])

    same = [held(w, "same") for w in opened]
    assert same[0] == same[1] and keeps(repos[0]) and keeps(repos[1])
    branches.point_branch(opened[0], "reached", str(same[0]))
    objects.release(opened[0], same[0])
    assert keeps(repos[0]) == [] and keeps(repos[1])  # the other repository's stays kept
    for n in range(2 * objects._FAN_IN):  # roll-ups in the first repository
        oid = held(opened[0], f"more {n}")
        branches.point_branch(opened[0], f"b{n}", str(oid))
        objects.release(opened[0], oid)
    gc(repos[1])  # nothing of the second's reaches its commit: only its kept pack holds it
    assert exists(repos[1], str(same[1]))
    git(repos[0], "fsck", "--strict", "--no-dangling")


def test_a_dead_coders_keeps_and_temporary_files_are_swept_a_live_ones_never(
    make_repo,
) -> None:
    repo = make_repo({"a.txt": "a\n"})
    pack_dir = repo / ".git" / "objects" / "pack"
    pack_dir.mkdir(parents=True, exist_ok=True)
    ended = subprocess.Popen(["true"])
    ended.wait()
    dead = f"{owner.pid_namespace()}-{ended.pid}-1"  # its pid with another start: gone
    live = owner.tag()
    planted = {
        "pack-1.keep": f"coder {dead}\n",
        "pack-2.keep": f"coder {live}\n",
        "pack-3.keep": "receive-pack 123 on host\n",  # git's own: never coder's to remove
        f".coder-{dead}.abc": "",
        f".coder-{live}.def": "",
    }
    for name, text in planted.items():
        (pack_dir / name).write_text(text)
    objects.sweep(repository.open_repo(repo))
    left = sorted(p.name for p in pack_dir.iterdir() if p.name in planted)
    assert left == sorted(["pack-2.keep", "pack-3.keep", f".coder-{live}.def"])


def test_staging_stages_again_what_a_prune_took_from_the_index(make_repo, tmp_path) -> None:
    """The index names a blob a prune took (it was written, then pruned before a ref reached
    it): the next staging writes it again from the file."""
    from coder.git import worktrees

    repo = make_repo({"a.txt": "a\n"})
    r = repository.open_repo(repo)
    wt = worktrees.create_worktree(
        r, name="t", path=repo / ".coder" / "worktrees" / "t", branch="agent/t", start="main"
    )
    (wt / "b.txt").write_text("bee\n")
    base = branches.resolve_commit(r, "main")
    pack_dir = repo / ".git" / "objects" / "pack"
    before = set(pack_dir.iterdir())
    first = staging.stage(wt, base)
    blob = first.changes[0].new
    assert blob is not None and exists(repo, blob[1])
    for path in set(pack_dir.iterdir()) - before:  # the staged objects' pack, as a prune would
        path.unlink()
    assert not exists(repo, blob[1])
    again = staging.stage(wt, base)
    assert again.tree == first.tree and exists(repo, blob[1])


def _worktree_with_a_new_file(make_repo):
    """A repository of `a.txt`, and its worktree on agent/t where `d/b.txt` was added."""
    from coder.git import worktrees

    repo = make_repo({"a.txt": "a\n"})
    r = repository.open_repo(repo)
    wt = worktrees.create_worktree(
        r, name="t", path=repo / ".coder" / "worktrees" / "t", branch="agent/t", start="main"
    )
    (wt / "d").mkdir()
    (wt / "d" / "b.txt").write_text("bee\n")
    return repo, r, wt


def test_staging_writes_one_pack_and_no_loose_object(make_repo) -> None:
    """libgit2's writes while staging (the blobs and trees) go into one pack of git's format:
    no loose file each, and the index written after it names only objects on disk."""
    repo, r, wt = _worktree_with_a_new_file(make_repo)
    (wt / "c.txt").write_text("sea\n")
    loose = set((repo / ".git" / "objects").glob("??/*"))
    pack_dir = repo / ".git" / "objects" / "pack"
    before = set(pack_dir.glob("*.idx"))
    staged = staging.stage(wt, branches.resolve_commit(r, "main"))
    assert set((repo / ".git" / "objects").glob("??/*")) == loose  # no loose object made
    (idx,) = set(pack_dir.glob("*.idx")) - before
    listed = git(repo, "verify-pack", "-v", str(idx))
    assert all(o in listed for o in staged.brings) and len(staged.brings) == 4
    assert git(wt, "ls-files").split() == ["a.txt", "c.txt", "d/b.txt"]
    git(wt, "fsck", "--strict", "--no-dangling")


def _held_step(make_repo):
    """A worktree on agent/t with a step's changes, staged and held (as verify stages them)."""
    repo, r, wt = _worktree_with_a_new_file(make_repo)
    (wt / "a.txt").write_text("changed\n")
    index_before = (repo / ".git" / "worktrees" / "t" / "index").read_bytes()
    packs = set((repo / ".git" / "objects" / "pack").glob("*")), set(loose(repo))
    w = repository.open_worktree(wt)
    tip = branches.resolve_commit(r, "main")
    staged = staging.stage(wt, tip, repo=w, hold=True)
    return repo, wt, w, tip, staged, index_before, packs


def _step(wt: Path, tip: str, staged: staging.Staged, repo=None) -> str | None:
    return commits.commit_step(
        wt,
        branch="agent/t",
        task_id="t",
        step_id="s1",
        attempt=1,
        title="s1",
        expected_tip=tip,
        staged=staged,
        repo=repo,
    )


def test_a_held_staging_writes_nothing_until_the_commit_takes_it_into_its_one_pack(
    make_repo,
) -> None:
    """stage(hold=True) puts nothing on disk (no pack, no loose object, the index as it was);
    the commit's kept pack takes its objects with the commit, and the index is written after
    it: one pack a step. A prune meanwhile takes nothing of it."""
    repo, wt, w, tip, staged, index_before, (packs, objs) = _held_step(make_repo)
    pack_dir = repo / ".git" / "objects" / "pack"
    assert set(loose(repo)) == objs and set(pack_dir.glob("*")) == packs  # nothing written
    assert (repo / ".git" / "worktrees" / "t" / "index").read_bytes() == index_before
    assert staged.held is w and w[staged.tree].type_str == "tree"  # reads through it see them
    gc(repo)
    commit = _step(wt, tip, staged, repo=w)
    assert commit is not None
    assert set(loose(repo)) <= objs  # none written (the gc packed main's)
    (idx,) = [p for p in pack_dir.glob("*.idx") if commit in git(repo, "verify-pack", "-v", str(p))]
    listed = git(repo, "verify-pack", "-v", str(idx))
    assert all(o in listed for o in [commit, *staged.brings])
    assert git(wt, "rev-parse", "HEAD").strip() == commit
    assert git(wt, "status", "--porcelain").strip() == ""  # the index names the commit's tree
    assert git(wt, "show", "HEAD:d/b.txt") == "bee\n"
    gc(repo)
    git(repo, "fsck", "--strict", "--no-dangling")


def test_a_held_staging_committed_through_another_repository_is_put_on_disk_first(
    make_repo,
) -> None:
    """The objects a repository holds in memory are not another's: a commit through a
    repository opened anew settles them first (`settle`), and commits the same tree."""
    repo, wt, w, tip, staged, _, _ = _held_step(make_repo)
    commit = _step(wt, tip, staged)  # repo=None: opened anew
    assert commit is not None and git(wt, "status", "--porcelain").strip() == ""
    assert git(wt, "rev-parse", "HEAD^{tree}").strip() == staged.tree
    gc(repo)
    git(repo, "fsck", "--strict", "--no-dangling")


def test_a_held_staging_that_is_not_committed_leaves_the_disk_as_it_was(make_repo) -> None:
    """A step that fails verify is discarded: what its staging held never reaches the disk."""
    repo, wt, w, tip, staged, index_before, (packs, objs) = _held_step(make_repo)
    del staged, w
    import gc as collector

    collector.collect()
    assert set((repo / ".git" / "objects" / "pack").glob("*")) == packs
    assert set(loose(repo)) == objs
    assert (repo / ".git" / "worktrees" / "t" / "index").read_bytes() == index_before
    git(repo, "fsck", "--strict")


def test_a_repository_whose_writes_were_put_down_writes_through_to_disk(make_repo) -> None:
    """After `put_down`, what libgit2 writes through the repository is on disk at once."""
    repo, wt, w, tip, staged, _, _ = _held_step(make_repo)
    staging.settle(staged)
    blob = w.create_blob(b"later\n")
    assert exists(repo, str(blob))


def test_a_checkout_snapshot_is_held_until_the_runs_branch_is_made_there(make_repo) -> None:
    """`run --include-uncommitted`: the snapshot of the user's changes is a commit on no ref
    until the run's branch starts at it."""
    from coder.git import snapshot, worktrees

    repo = make_repo({"a.txt": "a\n"})
    (repo / "a.txt").write_text("changed\n")
    w = repository.open_repo(repo)
    base = branches.resolve_commit(w, "main")
    made = snapshot.snapshot(w, repo, base, ["a.txt"], task_id="t")
    assert made is not None and keeps(repo)
    gc(repo)
    assert exists(repo, made.commit)
    worktrees.create_worktree(
        w, name="t", path=repo / ".coder" / "worktrees" / "t", branch="agent/t", start=made.commit
    )
    assert keeps(repo) == []
    gc(repo)
    git(repo, "fsck", "--strict", "--no-dangling")
