"""A git index file's entries as `git status` and the next commit see them, read without
libgit2 (the git guard compares the index before and after a command with this: the file times
and sizes git refreshes, and cache extensions, are not a change).
"""

from __future__ import annotations

import struct

_ASSUME_VALID, _EXTENDED, _STAGE = 0x8000, 0x4000, 0x3000
_SKIP_WORKTREE, _INTENT_TO_ADD = 0x4000, 0x2000


def index_entries(data: bytes) -> list[tuple[bytes, ...]] | bytes:
    """What an index says about the next commit and what `git status` shows: each entry's path,
    mode, object id, stage and the assume-unchanged, skip-worktree and intent-to-add flags; not
    the file times and sizes git refreshes, nor cache extensions. The bytes themselves when
    the index is not one this reads (another version, a split index)."""
    try:
        return _parse_index(data)
    except (ValueError, struct.error, IndexError):
        return data


def _parse_index(data: bytes) -> list[tuple[bytes, ...]]:
    signature, version, count = struct.unpack_from(">4sII", data)
    if signature != b"DIRC" or version not in (2, 3, 4):
        raise ValueError("not an index")
    entries: list[tuple[bytes, ...]] = []
    pos, previous = 12, b""
    for _ in range(count):
        start = pos
        mode = data[pos + 24 : pos + 28]
        oid = data[pos + 40 : pos + 60]
        (flags,) = struct.unpack_from(">H", data, pos + 60)
        pos += 62
        extended = 0
        if flags & _EXTENDED:
            if version < 3:
                raise ValueError("extended flags before version 3")
            (extended,) = struct.unpack_from(">H", data, pos)
            pos += 2
        if version == 4:
            strip, pos = _varint(data, pos)
            end = data.index(b"\0", pos)
            path = previous[: len(previous) - strip] + data[pos:end]
            pos = end + 1
        else:
            end = data.index(b"\0", pos)
            path = data[pos:end]
            pos = start + ((end - start + 8) & ~7)  # 1 to 8 NULs pad the entry
        previous = path
        flags &= _ASSUME_VALID | _STAGE
        extended &= _SKIP_WORKTREE | _INTENT_TO_ADD
        entries.append((path, mode, oid, bytes([flags >> 8, extended >> 8])))
    while pos + 8 <= len(data) - 20:  # extensions, then the checksum
        name, size = struct.unpack_from(">4sI", data, pos)
        if name == b"link":  # a split index: the entries live in another file too
            raise ValueError("split index")
        pos += 8 + size
    return entries


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """git's offset encoding (index version 4)."""
    byte = data[pos]
    pos += 1
    value = byte & 0x7F
    while byte & 0x80:
        byte = data[pos]
        pos += 1
        value = ((value + 1) << 7) | (byte & 0x7F)
    return value, pos
