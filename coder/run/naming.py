"""Which run a command means: `-t` with a whole id or a unique prefix of one, `--last`, or
nothing where the project has exactly one run."""

from __future__ import annotations

from pathlib import Path

from coder.display import listed
from coder.errors import CoderError, InvalidInput
from coder.run.manifest import load_manifest, made_order, run_ids

_LISTED = 5  # ids named in a refusal


def which_run(coder_dir: Path, given: str | None, *, last: bool = False, only: bool = True) -> str:
    """The id of the run `given` names (an id, or the start of exactly one; passed on as it
    is when it starts none), the newest run with `last` (the last made, by coder's count, not
    the clock), or, with `only`, the only run when neither is given. InvalidInput naming the
    candidates when that is not one run."""
    known = run_ids(coder_dir)
    if given is not None and last:
        raise InvalidInput("pass -t ID or --last, not both")
    if given is None and not known:
        raise InvalidInput("no runs in this project yet", hint="start one with `coder run`")
    if last:
        return max(known, key=lambda task_id: (_made(coder_dir, task_id), task_id))
    if given is None:
        if len(known) == 1 and only:
            return known[0]
        newest = sorted(known, key=lambda i: (_made(coder_dir, i), i), reverse=True)
        raise InvalidInput(
            f"this project has {len(known)} run{'s' * (len(known) != 1)}: say which with -t ID "
            "(the start of an id will do) or --last for the newest",
            hint=f"newest first: {_listing(newest)}",
        )
    if given in known:
        return given
    starting = [task_id for task_id in known if task_id.startswith(given)]
    if len(starting) == 1:
        return starting[0]
    if starting:
        raise InvalidInput(
            f"{given!r} is the start of {len(starting)} run ids: {_listing(starting)}",
            hint="give more of the id",
        )
    return given  # no such run: the command says so, with what is left of it (a branch...)


def _made(coder_dir: Path, task_id: str) -> tuple[bool, int, str]:
    """The run's place in the order runs were made (coder.run.manifest.made_order)."""
    try:
        return load_manifest(coder_dir, task_id).order
    except CoderError:  # unreadable: listed, never the newest
        return made_order(None, "")


def _listing(ids: list[str]) -> str:
    return listed(ids, _LISTED)
