"""The objects a commit of coder's brings, held from git's prune until a ref reaches them.

git prune deletes every loose object that nothing reaches (refs, reflogs, each worktree's HEAD
and index) and that is older than its expiry: two weeks for `git gc`, any age for `git gc
--prune=now` (a user's or an IDE's maintenance: "now" keeps nothing, not even an object dated
in the future). Whoever writes objects writes them before the ref that reaches them: a commit
before its branch moves to it. A prune that reads the refs in between and sweeps after takes
the commit, and the branch then names a commit that is gone (`git fsck` fails on it; the run
could neither go on nor be resumed).

A ref cannot come first (git refuses a ref to a missing object). So coder does what `git
receive-pack` and `git fetch` do with the objects they receive: the objects a commit brings
(the commit, and the trees and blobs of its tree that its first parent's lacks) go into a pack
of their own with a `.keep` file before any ref moves to it (`hold`; a new commit is written
there and nowhere else, `write_held_commit`); no `git gc`, `repack` or `prune` deletes a kept
pack or what it holds. Once a ref reaches the commit the `.keep` goes
(`release`). Packs nothing reached (a kill, a refused compare-and-swap) are released when
coder exits, or after a SIGKILL by the next coder (`sweep`; the `.keep` names its owner,
coder.files.owner); released, what nothing reaches goes with the next prune.

Before the commit is made, a step's blobs and trees are held in memory, where no prune reaches
them (`hold_writes`): the commit's kept pack takes them with the commit, and the worktree's
index that names them is written after it; a step that makes no commit puts them down in a
pack of their own before its index (coder.git.staging.settle). One libgit2 found on disk and
so did not write, a prune may take: it is staged again from the files (coder.git.staging). An
object libgit2 read before a prune took it stays in its cache, and a pack holds it all the
same.

Released packs are rolled up as they accumulate, `_FAN_IN` of one size into one, so that a run
of 10,000 steps leaves a few dozen packs, not 10,000 (git and libgit2 look an object up pack by
pack). Each pack is written as git writes one: to a temporary file, its `.keep` first, the pack,
its index last (an index makes a pack visible).

A new file costs some disks far more than a link or a rename (coder.files.ahead), and a pack a
step wrote made three. So a step writes one pack, not a loose object each and then a pack; a
`.keep` is a hard link to one this process made once (git asks only whether a `.keep` exists;
its text names the owner either way); and the pack and its index are written into files made
ahead.

What a run whose commits lost objects all the same (before this, or by hand) needs is in
coder.git.recovery.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import itertools
import os
import struct
import threading
import weakref
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pygit2

from coder.errors import ObjectsMissing
from coder.files import ahead, nofollow, owner
from coder.git.repository import Repo, common_dir

Oid = pygit2.Oid | str
_Entry = tuple[bytes, int, int]  # raw id, crc32 of its entry in the pack, offset
_FAN_IN = 8  # released packs of one size rolled up into one
_COMMIT = int(pygit2.enums.ObjectType.COMMIT)
_KEEP = "coder"  # how a `.keep` of coder's starts: `coder <owner tag>`


def gone(what: str, oids: Iterable[str]) -> ObjectsMissing:
    """The error for objects that are gone (``what``: what they were for)."""
    found = list(oids)
    shown = ", ".join(o[:12] for o in found[:3]) + (f" (+{len(found) - 3})" * (len(found) > 3))
    named = f"git object{'s' * (len(found) != 1)} {shown} {'are' if found[1:] else 'is'}"
    return ObjectsMissing(
        f"{what}: {named if found else 'a git object it wrote is'} missing from the "
        "repository (pruned by a `git gc --prune=now` or `git prune` meanwhile?)",
        hint="run it again once the prune is done",
        oids=found,
    )


def commit_of(repo: Repo, rev: str, what: str) -> pygit2.Commit:
    """The commit ``rev`` (``what``: "the tip of agent/x"), its tree read; ObjectsMissing,
    with resume's way out, when a prune took either."""
    try:
        commit = repo[rev].peel(pygit2.Commit)
        commit.tree  # noqa: B018 - read here, not halfway through a commit
    except (KeyError, ValueError, pygit2.GitError):
        raise ObjectsMissing(
            f"commit {rev[:12]} ({what}) or its tree is missing from the repository (pruned "
            "by a `git gc --prune=now` or `git prune`?)",
            hint="`coder resume` moves the branch back to its last complete commit and runs the "
            "steps after it again",
        ) from None
    return commit


# --- holding a commit's objects in a kept pack ----------------------------------------------


@dataclass
class _Pack:
    stem: Path  # objects/pack/pack-<checksum>
    spans: list[tuple[bytes, int, int]]  # each object's raw id, and where its entry lies
    level: int = 0  # how many roll-ups made it
    keeps: bool = False  # its .keep is ours to remove


@dataclass
class _Held:
    """This process's packs: kept ones by their pack directory and the commit they hold,
    released ones to roll up."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    kept: dict[tuple[str, str], list[_Pack]] = field(default_factory=dict)
    released: dict[str, list[_Pack]] = field(default_factory=dict)  # by pack directory


_held = _Held()


def hold(repo: Repo, commit: Oid, oids: Iterable[Oid]) -> None:
    """Put ``oids`` (``commit`` and the objects it brings) into a kept pack until a ref reaches
    ``commit`` (`release`). ObjectsMissing, holding nothing, if one of them is gone."""
    _hold(repo, str(commit), oids, [])


def write_held_commit(repo: Repo, content: bytes, brings: Iterable[Oid]) -> pygit2.Oid:
    """The commit whose raw ``content`` is given (`Repository.create_commit_string`), written
    straight into a kept pack with what it brings (`hold`), never as a loose object: its id.
    The pack takes whatever ``repo`` holds in memory too (`hold_writes`): staging and commit
    write one pack a step, not two."""
    oid = pygit2.Oid(hex=hashlib.sha1(b"commit %d\0" % len(content) + content).hexdigest())
    _hold(repo, str(oid), brings, [(oid.raw, _entry(_COMMIT, content))], _holding.get(repo))
    return oid


def _hold(
    repo: Repo,
    commit: str,
    oids: Iterable[Oid],
    pieces: list[tuple[bytes, bytes]],
    held: _Written | None = None,
) -> None:
    """A kept pack of ``pieces``, the objects ``oids`` and those ``held`` in memory, kept for
    ``commit``."""
    found = dict(held.objects) if held is not None else {}
    odb = repo.odb
    missing = []
    for oid in dict.fromkeys(pygit2.Oid(hex=str(o)) for o in oids):
        if oid in found:
            continue
        try:
            found[oid] = odb.read(oid)
        except (KeyError, pygit2.GitError):
            missing.append(str(oid))
    if missing:
        raise gone("the commit's objects", missing)
    pieces += [(oid.raw, _entry(int(kind), data)) for oid, (kind, data) in found.items()]
    pack = _write(_pack_dir(repo), pieces, keep=True)
    if held is not None:
        held.put_down()
    with _held.lock:
        _held.kept.setdefault((str(pack.stem.parent), commit), []).append(pack)


def _pack_dir(repo: Repo) -> Path:
    return common_dir(repo) / "objects" / "pack"


def release(repo: Repo, commit: Oid) -> None:
    """A ref of ``repo`` reaches ``commit`` now: its kept packs there are released, and rolled
    up as they pile up. By repository: two repositories one process works in can write the same
    commit (same tree, parents, identity and second), and one's ref reaches only its own."""
    with _held.lock:
        packs = _held.kept.pop((str(_pack_dir(repo)), str(commit)), [])
        for pack in packs:
            _unkeep(pack)
        _add_released(packs)


def _add_released(packs: list[_Pack]) -> None:
    if packs:
        released = _held.released.setdefault(str(packs[0].stem.parent), [])
        released.extend(packs)
        _roll_up(released)


# --- what libgit2 writes, packed --------------------------------------------------------------


def hold_writes(repo: Repo) -> None:
    """From now on the objects libgit2 writes through ``repo`` (staging a step: its blobs and
    trees) are held in memory, where reads through ``repo`` find them first, not each written
    to a loose file: a new file costs some disks 0.3-0.8 ms (coder.files.ahead). They go to
    disk in one pack: kept, with the commit that records them (`write_held_commit`), or not
    (`put_down`); like loose objects, they are reached once the index that names them is
    written (coder.git.staging writes it right after). A prune cannot take them meanwhile:
    they are not on disk. Once put down, what libgit2 writes through ``repo`` goes to disk as
    it writes it."""
    held = _holding.get(repo)
    if held is None:
        held = _holding[repo] = _Written(_pack_dir(repo).parent)
        repo.odb.add_backend(held, 1000)  # the highest priority: written to, and read, first
    held.holding = True


def put_down(repo: Repo) -> None:
    """What ``repo`` holds in memory (`hold_writes`) in one pack, not kept, rolled up with
    coder's others."""
    held = _holding.get(repo)
    if held is not None and held.holding:
        write_pack(repo, held.objects)
        held.put_down()


def write_pack(repo: Repo, found: Mapping[pygit2.Oid, tuple[int, bytes]]) -> None:
    """``found`` (objects by id: their kind and data) in one pack of ``repo``, not kept (see
    `hold_writes`), rolled up with coder's others."""
    if found:
        pieces = [(oid.raw, _entry(kind, data)) for oid, (kind, data) in found.items()]
        pack = _write(_pack_dir(repo), pieces, keep=False)
        with _held.lock:
            _add_released([pack])


# Each repository's backend of held objects, for as long as the repository is open: libgit2
# cannot take a backend out of an object database again.
_holding: weakref.WeakKeyDictionary[Repo, _Written] = weakref.WeakKeyDictionary()


class _Written(pygit2.OdbBackend):
    """libgit2's writes, held in memory and read back from there (`hold_writes`); once put
    down, written through to the objects directory as loose objects."""

    def __init__(self, objects_dir: Path) -> None:
        super().__init__()
        self.objects: dict[pygit2.Oid, tuple[int, bytes]] = {}
        self.holding = True
        self.objects_dir = objects_dir

    def put_down(self) -> None:
        """Its objects are on disk now: let them go, and write through from now on."""
        self.objects, self.holding = {}, False

    def write_cb(self, oid: pygit2.Oid, data: bytes, kind: int) -> None:
        if self.holding:
            self.objects[oid] = (int(kind), bytes(data))
        else:
            pygit2.Odb(str(self.objects_dir)).write(kind, bytes(data))

    def read_cb(self, oid: pygit2.Oid) -> tuple[int, bytes]:
        return self.objects[oid]

    def read_header_cb(self, oid: pygit2.Oid) -> tuple[int, int]:
        kind, data = self.objects[oid]
        return kind, len(data)

    def read_prefix_cb(self, prefix: str) -> tuple[int, bytes, pygit2.Oid]:
        oid = self.exists_prefix_cb(prefix)  # `Odb.read` asks by prefix, a whole id's too
        return (*self.objects[oid], oid)

    def exists_cb(self, oid: pygit2.Oid) -> bool:
        return oid in self.objects

    def exists_prefix_cb(self, prefix: str) -> pygit2.Oid:
        if len(prefix) == pygit2.GIT_OID_HEXSZ:
            found = [pygit2.Oid(hex=prefix)]
            if found[0] not in self.objects:
                raise KeyError(prefix)
        else:
            found = [oid for oid in self.objects if str(oid).startswith(prefix)]
        if len(found) != 1:
            raise KeyError(prefix)  # none here (libgit2 asks the other backends), or two
        return found[0]

    def refresh_cb(self) -> None:
        pass

    def __iter__(self) -> Iterator[pygit2.Oid]:
        return iter(list(self.objects))


def _unkeep(pack: _Pack) -> None:
    if pack.keeps:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{pack.stem}.keep")
        pack.keeps = False


def _roll_up(released: list[_Pack]) -> None:
    """While the newest `_FAN_IN` released packs are of one level, write one pack of their
    entries (copied as they are: an entry of a whole object means the same at any offset)
    and delete them, the index first. A pack a `git repack` deleted meanwhile (its objects
    are in git's new pack) is forgotten."""
    while len(released) >= _FAN_IN and len({p.level for p in released[-_FAN_IN:]}) == 1:
        group = released[-_FAN_IN:]
        pieces: dict[bytes, bytes] = {}
        try:
            for pack in group:
                data = Path(f"{pack.stem}.pack").read_bytes()
                for raw, start, end in pack.spans:
                    pieces.setdefault(raw, data[start:end])
        except FileNotFoundError:
            released.remove(pack)
            continue
        except OSError:
            return  # left as they are: git's next repack packs them with the rest
        try:
            merged = _write(group[0].stem.parent, list(pieces.items()), keep=False)
        except OSError:
            return
        for pack in group:
            if pack.stem != merged.stem:
                for suffix in (".idx", ".pack"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(f"{pack.stem}{suffix}")
        merged.level = group[0].level + 1
        released[-_FAN_IN:] = [merged]


@atexit.register
def _release_all() -> None:
    """At exit: nothing of this process stays kept (what no ref reached goes with a prune)."""
    with _held.lock:
        for packs in _held.kept.values():
            for pack in packs:
                _unkeep(pack)
        _held.kept.clear()
        for (pid, _), path in list(_keeps.items()):
            if pid == os.getpid():
                with contextlib.suppress(OSError):
                    os.unlink(path)
                del _keeps[(pid, _)]


def sweep(repo: Repo) -> None:
    """Release the packs coders that are gone kept (killed before a ref reached their commit),
    and remove their temporary files (`owner.gone`)."""
    pack_dir = common_dir(repo) / "objects" / "pack"
    try:
        with nofollow.open_dir(pack_dir) as dir_fd:
            ahead.sweep(dir_fd)
            names = [n for n in os.listdir(dir_fd) if n.endswith(".keep")]
            for name in names:
                try:
                    text = _read_keep(name, dir_fd)
                except OSError:
                    continue
                left = text[1] if len(text) == 2 and text[0] == _KEEP else ""
                if owner.gone(left):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        return


def _read_keep(name: str, dir_fd: int) -> list[str]:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as f:
        return f.read(200).decode("ascii", "replace").split()


# --- the pack format (git's pack v2 and index v2; objects whole, no deltas) ----------------


def _entry(kind: int, data: bytes) -> bytes:
    """An object's entry in a pack: its type and size, then its data deflated."""
    size = len(data)
    header = bytearray()
    byte = (kind << 4) | (size & 0x0F)
    size >>= 4
    while size:
        header.append(byte | 0x80)
        byte, size = size & 0x7F, size >> 7
    header.append(byte)
    return bytes(header) + zlib.compress(data, 1)


def _write(pack_dir: Path, pieces: list[tuple[bytes, bytes]], *, keep: bool) -> _Pack:
    """A pack of ``pieces`` (each object's raw id and its `_entry`) in ``pack_dir``: written to
    temporary files, then (``keep``) its `.keep`, the pack, and its index last."""
    pack = bytearray(b"PACK" + struct.pack(">II", 2, len(pieces)))
    entries: list[_Entry] = []
    spans = []
    for raw, piece in pieces:
        entries.append((raw, zlib.crc32(piece), len(pack)))
        spans.append((raw, len(pack), len(pack) + len(piece)))
        pack += piece
    checksum = hashlib.sha1(pack).digest()
    pack += checksum
    stem = pack_dir / f"pack-{checksum.hex()}"
    written = [_temporary(pack_dir, pack), _temporary(pack_dir, _index_bytes(entries, checksum))]
    try:
        kept = keep and _make_keep(stem)
        os.replace(written[0], f"{stem}.pack")
        os.replace(written[1], f"{stem}.idx")
    finally:
        for path in written:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    return _Pack(stem, spans, keeps=kept)


def _index_bytes(entries: list[_Entry], checksum: bytes) -> bytes:
    entries = sorted(entries)
    out = bytearray(b"\377tOc" + struct.pack(">I", 2))
    fanout = [0] * 256
    for raw, _, _ in entries:
        fanout[raw[0]] += 1
    out += struct.pack(">256I", *itertools.accumulate(fanout))
    large: list[int] = []  # offsets past 2 GiB, in a table of their own
    small = bytearray()
    for raw, _, offset in entries:
        out += raw
        if offset < 0x80000000:
            small += struct.pack(">I", offset)
        else:
            small += struct.pack(">I", 0x80000000 | len(large))
            large.append(offset)
    for _, crc, _ in entries:
        out += struct.pack(">I", crc)
    out += small + b"".join(struct.pack(">Q", offset) for offset in large) + checksum
    out += hashlib.sha1(out).digest()
    return bytes(out)


def _temporary(pack_dir: Path, data: bytes | bytearray) -> str:
    """``data`` in a new read-only file of pack_dir, named as `sweep` finds it: a file made
    ahead when one is ready (coder.files.ahead), else one made now."""
    name = ahead.fresh_name()
    with nofollow.open_dir(pack_dir) as dir_fd:
        fd = ahead.claim(pack_dir, dir_fd, name)
        if fd is None:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(name, flags, 0o444, dir_fd=dir_fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, 0o444)
        finally:
            os.close(fd)
    return str(pack_dir / name)


def _make_keep(stem: Path) -> bool:
    """Whether the `.keep` is ours (one already there is another's, which keeps it too): a
    link to this process's own (`_keep_to_link`), or a file of its own where links fail."""
    keep = f"{stem}.keep"
    try:
        os.link(_keep_to_link(stem.parent), keep)
        return True
    except FileExistsError:
        return False
    except OSError:  # no hard links on this file system, or ours was removed by hand
        _keeps.pop((os.getpid(), str(stem.parent)), None)
    try:
        _write_keep(keep)
    except FileExistsError:
        return False
    return True


_keeps: dict[tuple[int, str], str] = {}  # this process's `.keep` to link to, by pack directory


def _keep_to_link(pack_dir: Path) -> str:
    """This process's `.keep` in ``pack_dir``, made the first time (its name names no pack)."""
    key = (os.getpid(), str(pack_dir))
    with _held.lock:
        if key not in _keeps:
            path = str(pack_dir / f"{ahead.fresh_name()}.keep-to-link")
            _write_keep(path)
            _keeps[key] = path
        return _keeps[key]


def _write_keep(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
    with os.fdopen(fd, "w") as f:
        f.write(f"{_KEEP} {owner.tag()}\n")
