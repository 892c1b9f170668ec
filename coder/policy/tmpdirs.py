"""Temporary directories coder makes in the system's temporary directory, named by their owner,
so that a coder killed outright (SIGKILL: no atexit runs) leaves nothing a later coder cannot
find and remove.

    make(kind)    a new private directory `coder-<kind>-<owner tag>-<random>` (coder.files.owner);
                  `prefix(kind)` names one `tempfile.TemporaryDirectory` makes
    sweep()       remove those whose owner is gone: `coder resume`, `clean` and `revert` call it
                  once the killed runner's commands are ended (sandbox.kill_owned)

A sandbox's temporary root (coder.policy.confine) holds the TMPDIR of each of its commands, and
coder's own files for git (its object quarantine), so it is removed with all that is in it. A
directory another live coder made is never touched, nor one another user owns, nor a link:
the system's temporary directory is everyone's to write.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile

from coder.files import owner

_NAME = re.compile(r"coder-([a-z]+)-(\d+-\d+-\d+)-[^/]+")


def prefix(kind: str) -> str:
    """The start of the name of a directory for `kind` ("sandbox", "tree", ...) this coder
    makes: `tempfile.TemporaryDirectory(prefix=...)`, where it is removed when done."""
    return f"coder-{kind}-{owner.tag()}-"


def make(kind: str) -> str:
    """A new private directory (0700) for `kind`, named by this coder."""
    return tempfile.mkdtemp(prefix=prefix(kind))


def sweep() -> list[str]:
    """Remove the directories `make` made for coders that are gone (`owner.gone`); the ones
    removed."""
    where = tempfile.gettempdir()
    try:
        names = os.listdir(where)
    except OSError:
        return []
    removed = []
    for name in names:
        found = _NAME.fullmatch(name)
        if found is None or not owner.gone(found.group(2)):
            continue
        path = os.path.join(where, name)
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            continue
        shutil.rmtree(path, ignore_errors=True)  # fd-based: never follows a link inside
        removed.append(path)
    return removed
