"""Files PoolLedger writes (leases, checkpoints, snapshots, outputs): never through a link,
never in a directory someone else may change.

Why: a root-run service writes into a data directory that others can often read and
sometimes write. A member of its group who links `<home>/leases/<name>.lease` to a root-only
file would have it truncated and overwritten by the next `poolledger negotiator`. So every
file is opened with `O_NOFOLLOW` (a link at the name is refused, not followed), an existing
one must be a regular file with one name, owned by this user or root, and the directory
holding it (and the one above, which could rename it) must not let others replace it: not
group- or world-writable (unless sticky, as /tmp), not owned by another non-root user; the
directories above them not writable by others either. Readers are not checked: a log this
process may not safely write is read read-only (`streams.log.embedded`).
"""
from __future__ import annotations

import contextlib
import os
import pwd
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator

from streams.log.port import LogError

__all__ = ["UnsafePathError", "atomic_file", "check_directory", "check_parents", "open_private"]


class UnsafePathError(LogError):
    """A file or directory that others could have replaced; the message is the one line."""


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def check_directory(path: Path, *, owner: bool = True) -> None:
    """Refuse (UnsafePathError) a directory this process would write in and others may
    change: group/world-writable without the sticky bit, or (`owner`) owned by another
    non-root user."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return  # made by this process when first written (`check_parents` checks its parent)
    mode = st.st_mode
    if mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX:
        who = "everyone" if mode & stat.S_IWOTH else "its group"
        raise UnsafePathError(f"{path}: writable by {who} (mode {mode & 0o7777:o}): others could "
                              f"replace the files written in it; refused (chmod go-w {path})")
    me = os.geteuid()
    if owner and st.st_uid not in (0, me):
        raise UnsafePathError(f"{path}: owned by {_name(st.st_uid)}, who could replace the files "
                              f"{_name(me)} writes in it; refused")


def check_parents(path: Path) -> None:
    """`check_directory` of the directory a file is written in and of the one holding it
    (`<home>/leases/x.lease`: whoever may rename `leases` may replace the file too; for
    directories not made yet, the nearest two that exist), and of every directory above them
    for its mode only: whoever may write any of them may rename the path away. Ownership
    above those two is not checked (a user's tree under another's, as CI checkouts are)."""
    directory, checked = path.absolute().parent, 0
    while True:
        if directory.exists():
            check_directory(directory, owner=checked < 2)
            checked += 1
        if directory.parent == directory:
            return
        directory = directory.parent


def open_private(path: Path, flags: int, mode: int = 0o644) -> int:
    """`os.open(path, flags, mode)` that never follows a symbolic link at `path` and accepts an
    existing file only when it is a regular file with one name owned by this user or root,
    in directories `check_parents` accepts; UnsafePathError (one line) otherwise."""
    check_parents(path)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    except OSError as exc:
        if os.path.islink(path):
            raise UnsafePathError(f"{path}: a symbolic link; refused (PoolLedger never writes "
                                  "through a link)") from None
        raise
    st = os.fstat(fd)
    problem = ("not a regular file" if not stat.S_ISREG(st.st_mode)
               else f"{st.st_nlink} names (a hard link)" if st.st_nlink != 1
               else f"owned by {_name(st.st_uid)}" if st.st_uid not in (0, os.geteuid())
               else None)
    if problem is not None:
        os.close(fd)
        raise UnsafePathError(f"{path}: {problem}; refused (a file PoolLedger writes must be "
                              "its own)")
    os.set_blocking(fd, True)
    return fd


@contextlib.contextmanager
def atomic_file(path: Path, fsync: bool = False, buffering: int = -1,
                mode: int = 0o644) -> Iterator[BinaryIO]:
    """A file written aside and renamed over `path` on success, so readers see the old or
    the new content, never a mix; on failure the partial file is removed. Never writes
    through a link (a new name, renamed over whatever `path` was) and only in a directory
    others may not change (`check_parents`)."""
    check_parents(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb", buffering=buffering) as f:
            yield f
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
