"""`coder push -t ID`: the run's branch on a remote for review, and `coder merge --push`.

Compare-and-swap: coder replaces a remote branch only where it left it. The state keeps what
coder last pushed (`pushed`: remote URL, ref, commit); the push asks git to replace the remote
ref only if it is still at that commit, or, when coder never pushed it there, only if it does
not exist (`git push --force-with-lease=REF:EXPECTED`). Someone else's push to the branch
makes the push refuse (`RemoteBranchMoved`, exit 3) and leaves the remote branch as it is.
A rewritten branch (after `coder revert --mode reset`) replaces coder's own earlier push.

A push is recorded before it is made (`pushing`) and moved to `pushed` once git says it
landed. A push cut short (coder killed while git pushed, or git failing after the remote took
it) leaves its record behind: the next push asks the remote, and a branch at that commit is
coder's own, so a later push (after a revert, say) replaces it.

Credentials are git's business (coder.git.remotes runs the git program); the remote's URL is
recorded and shown without its user and password. The report (`coder report`'s Markdown) is
the pull request's body; the compare URL opens the pull request on GitHub, GitLab,
Gitea/Forgejo and Bitbucket.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from coder.errors import EnvironmentProblem, InvalidInput, RemoteBranchMoved
from coder.git import branches, remotes
from coder.run.opened import open_run
from coder.run.records import PushRecord, RunState, now_iso
from coder.services import history
from coder.services import report as report_service


@dataclass(frozen=True)
class PushResult:
    task_id: str
    outcome: str  # pushed | up_to_date
    remote: str
    url: str  # the remote's URL, user and password cut out
    ref: str  # refs/heads/BRANCH on the remote
    commit: str
    previous: str | None  # where the remote branch was (None: it did not exist)
    compare_url: str | None  # None: the remote's host is of no known kind
    body: str  # the pull request's body: the run's report, Markdown
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["warnings"] = list(self.warnings)
        return data


def push_run(cwd: Path, task_id: str, *, remote: str | None = None) -> PushResult:
    """Push run `task_id`'s branch (see the module docstring)."""
    with open_run(cwd, task_id, holder="push") as view:  # the state read under the lock
        repo, store, state, manifest = view.repo, view.store, view.state, view.manifest
        name = remote or remotes.default_remote(repo, manifest.base)
        url = remotes.shown_url(remotes.remote_url(repo, name))
        tip = branches.branch_tip(repo, manifest.branch)
        if tip is None:
            raise InvalidInput(f"branch {manifest.branch} of run {task_id} no longer exists")
        ref = f"refs/heads/{manifest.branch}"
        last = state.pushed = _landed(view.root, name, url, ref, state)
        ours = last["commit"] if last and (last["url"], last["ref"]) == (url, ref) else None
        state.pushing = {
            "remote": name,
            "url": url,
            "ref": ref,
            "commit": tip,
            "pushed_at": now_iso(),
        }
        store.save(state)  # before git pushes: killed at any point, the next push knows
        pushed = remotes.push(view.root, name, [f"{tip}:{ref}"], lease=(ref, ours or ""))
        outcome = "up_to_date" if pushed.refs.get(ref, ("",))[0] == "=" else "pushed"
        if not pushed.ok:
            now = remotes.remote_ref(view.root, name, ref) if pushed.rejected(ref) else None
            if now != tip:
                raise _refusal(pushed, name, ref, now, ours, tip)
            outcome = "up_to_date"  # a push whose record was lost put it there
        state.pushed, state.pushing = state.pushing, None
        store.save(state)
    body = report_service.render(report_service.build(view), history.redactor_of(view), "md")
    warnings = []
    if state.status != "success":
        warnings.append(f"run {task_id} is {state.status}: the branch holds the steps done so far")
    return PushResult(
        task_id=task_id,
        outcome=outcome,
        remote=name,
        url=url,
        ref=ref,
        commit=tip,
        previous=ours,
        compare_url=remotes.compare_url(
            remotes.remote_urls(repo, name), base=manifest.base, branch=manifest.branch
        ),
        body=body,
        warnings=tuple(warnings),
    )


def _landed(root: Path, remote: str, url: str, ref: str, state: RunState) -> PushRecord | None:
    """What coder last pushed: `pushed`, or a later push to this remote branch that was cut
    short (`pushing` left behind) when the remote branch is at its commit now: it landed."""
    cut = state.pushing
    if cut and (cut["url"], cut["ref"]) == (url, ref):
        if remotes.remote_ref(root, remote, ref) == cut["commit"]:
            return cut
    return state.pushed


def _refusal(
    pushed: remotes.Pushed, remote: str, ref: str, now: str | None, ours: str | None, tip: str
) -> EnvironmentProblem:
    branch = ref.removeprefix("refs/heads/")
    if not pushed.rejected(ref) or now is None and ours is None:
        return EnvironmentProblem(
            f"git push to {remote} failed: {pushed.message or 'no reason given'}",
            hint="check the remote's address and your access (`git push` with the same "
            "remote should work); coder uses git's own credentials",
        )
    where = f"is at {now[:12]}" if now else "was deleted"
    since = (
        f"coder last pushed {ours[:12]} there" if ours else "coder never pushed that branch there"
    )
    return RemoteBranchMoved(
        f"branch {branch} on {remote} {where}, and {since}: someone else pushed to it; "
        f"refusing to overwrite it (the remote branch is unchanged, the run's tip is {tip[:12]})",
        hint=f"see what is there with `git fetch {remote} {branch}` and `git log FETCH_HEAD`; "
        f"push the run elsewhere with --remote, or delete the remote branch and push again",
    )


@dataclass(frozen=True)
class MergePushResult:
    remote: str
    url: str
    base: str
    commit: str
    tag: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def merge_remote(cwd: Path, task_id: str, remote: str | None) -> str:
    """The remote `coder merge --push` will push to, checked before anything is merged."""
    run = open_run(cwd, task_id)
    name = remote or remotes.default_remote(run.repo, run.manifest.base)
    remotes.remote_url(run.repo, name)
    return name


def push_merge(cwd: Path, task_id: str, *, remote: str | None = None) -> MergePushResult:
    """After `coder merge`: the base branch and the run's tag to the remote, both or neither
    (`--atomic`). An ordinary push: a remote base with commits this repository lacks refuses
    it (pull them, then `coder merge -t ID --push` again)."""
    view = open_run(cwd, task_id)
    merged = view.state.merge
    if not merged or "commit" not in merged:
        raise InvalidInput(f"run {task_id} has not been merged", hint=f"coder merge -t {task_id}")
    repo = view.repo
    base = merged.get("base") or view.manifest.base
    name = remote or remotes.default_remote(repo, base)
    url = remotes.shown_url(remotes.remote_url(repo, name))
    commit = branches.branch_tip(repo, base) or merged["commit"]
    tag = merged.get("tag")
    specs = [f"refs/heads/{base}:refs/heads/{base}"]
    if tag:
        specs.append(f"refs/tags/{tag}:refs/tags/{tag}")
    pushed = remotes.push(view.root, name, specs, atomic=True)
    if not pushed.ok:
        hint = (
            f"the remote's {base} has commits this repository lacks: `git pull` them, then "
            f"`coder merge -t {task_id} --push` again"
            if pushed.rejected(f"refs/heads/{base}")
            else "check the remote's address and your access; coder uses git's own credentials"
        )
        raise EnvironmentProblem(
            f"git push of {base}{' and ' + tag if tag else ''} to {name} failed: "
            f"{pushed.message or 'rejected'}",
            hint=hint,
        )
    return MergePushResult(name, url, base, commit, tag)
