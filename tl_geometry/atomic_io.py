"""Writing files as one unit: whole new files or the old ones, never a mix; a folder's lock; strict JSON text.

A result's two files, its report and a checkpoint are written through here; nothing in it knows what they hold,
so it sits on the lowest floor of the package (it imports only `tl_geometry.errors`).

A writer holds the folder's lock (`folder_lock`), stages every file of the
unit as a temporary file beside its target (`Unit.stage`), and commits them
together (`commit_unit`): once every file is complete and synced, a journal
naming the staged files is written (atomically), then each staged file is
renamed onto its target and the journal removed. A failure or interrupt
before the journal leaves the old files untouched; after it, the renames are
completed by whoever touches the folder next (`recover`, and readers follow
the journal through `committed_path`), so a reader never sees the new arrays
beside the old metadata, nor a new result beside an old report. SIGINT and
SIGTERM are held back during the renames.

The lock is an ``flock`` on ``<folder>/.tl-geometry.lock`` (``msvcrt.locking`` on
Windows): the kernel drops
it when its process dies, so a lock left by a killed run is simply taken over;
a second live writer gets a GeometryError naming the holder. Temporary files
carry their writer's pid (``.<name>.tlg<pid>.<random>.tmp``) so that those left
by a killed process are removed on the next commit in that folder.
"""

import contextlib
import json
import os
import re
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from tl_geometry.errors import GeometryError


def json_text(data: Any, **options: Any) -> str:
    """``json.dumps`` of ``data`` as strict JSON: NaN and +-inf written as ``null`` (which every JSON parser reads;
    bare ``NaN`` is Python's extension, refused by browsers' ``JSON.parse`` and by ``jq``). Tensors and NumPy
    arrays are written as lists. Options go to ``json.dumps``."""
    import math

    def strict(x: Any) -> Any:
        if hasattr(x, "tolist") and not isinstance(x, (str, bytes)):  # a tensor, array or NumPy scalar
            x = x.tolist()
        if isinstance(x, float):
            return x if math.isfinite(x) else None
        if isinstance(x, dict):
            return {k: strict(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [strict(v) for v in x]
        return x

    return json.dumps(strict(data), allow_nan=False, **options)


try:
    import fcntl
except ImportError:  # Windows: msvcrt's byte-range lock is also dropped when its process dies
    fcntl = None  # type: ignore[assignment]
    import msvcrt

LOCK_NAME = ".tl-geometry.lock"
JOURNAL_NAME = ".tl-geometry-commit.json"
_TEMP = re.compile(r"^\..+\.tlg(\d+)\.[0-9a-f]{8}\.tmp$")  # ours only: never another tool's
_held: dict[Path, int] = {}  # folders this process holds the lock of -> nesting depth
_held_guard = threading.Lock()


def _default_mode() -> int:
    """The permissions an ordinary ``open()`` would give (temporary files start owner-only)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def pid_alive(pid: int) -> bool:
    """Whether a process with this id runs on this machine (ours counts as alive)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def temp_path(target: Path) -> Path:
    """A fresh temporary name beside ``target`` that names this process."""
    return target.with_name(f".{target.name}.tlg{os.getpid()}.{secrets.token_hex(4)}.tmp")


def _open_for_writing(path: Path) -> Any:
    """Open a staged file (one place, so that tests can make the disk fill up here)."""
    return open(path, "xb")


def _fsync_folder(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not every filesystem syncs folders
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _try_lock(fd: int) -> bool:
    """Take an exclusive lock on an open file without waiting; False if another process holds it."""
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    except (BlockingIOError, PermissionError):
        return False
    return True


def _holder(lock: Path) -> str:
    try:
        info = json.loads(lock.read_text())
        return f"pid {info['pid']} on {info['host']}, since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


@contextmanager
def folder_lock(folder: str | os.PathLike) -> Iterator[Path]:
    """Hold ``<folder>/.tl-geometry.lock`` (created with the folder if needed); re-entrant in one process.

    Raises:
        GeometryError: another live process holds it.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    key = folder.resolve()
    with _held_guard:
        if key in _held:
            _held[key] += 1
            nested = True
        else:
            nested = False
    if nested:
        try:
            yield folder
        finally:
            with _held_guard:
                _held[key] -= 1
        return
    lock = folder / LOCK_NAME
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        if not _try_lock(fd):
            os.close(fd)
            raise GeometryError(
                f"{folder} is being written by another tl-geometry run ({_holder(lock)}); wait for it to finish "
                "or choose another output folder"
            ) from None
        try:  # the file we locked may have been removed by its previous holder meanwhile: lock the new one
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, json.dumps(info).encode())
    with _held_guard:
        _held[key] = 1
    try:
        yield folder
    finally:
        with _held_guard:
            del _held[key]
        with contextlib.suppress(OSError):
            os.unlink(lock)  # while still locked, so nobody locks a file that is going away
        os.close(fd)


def recover(folder: Path) -> None:
    """Finish a commit that was cut short and remove temporary files of dead processes (hold the lock)."""
    journal = folder / JOURNAL_NAME
    if journal.exists():
        for target, staged in _journal_entries(journal):
            if staged.exists():
                os.replace(staged, target)
        _fsync_folder(folder)
        journal.unlink()
    for path in folder.iterdir():
        match = _TEMP.match(path.name)
        if match and not pid_alive(int(match.group(1))) and path.is_file():
            with contextlib.suppress(OSError):
                path.unlink()


def _journal_entries(journal: Path) -> list[tuple[Path, Path]]:
    try:
        entries = json.loads(journal.read_text())
        return [(journal.with_name(target), journal.with_name(staged)) for target, staged in entries.items()]
    except (ValueError, AttributeError, TypeError) as error:
        raise GeometryError(
            f"{journal} is damaged ({error}); delete it (the files it names are the last complete result)"
        ) from None


def committed_path(target: Path) -> Path:
    """Where ``target``'s committed contents are: its staged file while a commit is being completed, else itself."""
    journal = target.parent / JOURNAL_NAME
    if journal.exists():
        with contextlib.suppress(OSError, GeometryError):
            for t, staged in _journal_entries(journal):
                if t.name == target.name and staged.exists():
                    return staged
    return target


@contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block ends (main thread only: elsewhere they never arrive)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class Unit:
    """The files of one commit, staged beside their targets."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.staged: dict[Path, Path] = {}

    def stage(self, target: str | os.PathLike) -> Path:
        """A temporary path to write ``target``'s new contents to (it must be in the unit's folder)."""
        target = Path(target)
        if target.parent.resolve() != self.folder.resolve():
            raise GeometryError(f"{target} is not in {self.folder}, the folder this unit commits")
        if target in self.staged:
            raise GeometryError(f"{target} is staged twice in one commit")
        self.staged[target] = temp_path(target)
        return self.staged[target]

    def write(self, target: str | os.PathLike, write: Callable[[IO[bytes]], Any]) -> None:
        """Stage ``target`` by calling ``write(file)`` on a new binary file, synced to disk."""
        with _open_for_writing(self.stage(target)) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())

    def _commit(self) -> None:
        mode = _default_mode()
        for staged in self.staged.values():
            if not staged.exists():
                raise GeometryError(f"{staged} was staged but never written")
            os.chmod(staged, mode)
        journal = self.folder / JOURNAL_NAME
        entries = {target.name: staged.name for target, staged in self.staged.items()}
        with _open_for_writing(tmp := temp_path(journal)) as f:
            f.write(json.dumps(entries).encode())
            f.flush()
            os.fsync(f.fileno())
        with _signals_held():
            os.replace(tmp, journal)  # the point of no return: from here on the new files are the result
            _fsync_folder(self.folder)
            recover(self.folder)

    def _discard(self) -> None:
        for staged in self.staged.values():
            with contextlib.suppress(OSError):
                staged.unlink()


@contextmanager
def commit_unit(folder: str | os.PathLike) -> Iterator[Unit]:
    """Stage files in ``folder`` inside the block; on success they replace their targets together.

    On an exception (a full disk, an interrupt) nothing is replaced and the staged files are removed.

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> with commit_unit(folder) as unit:
    ...     unit.write(folder / "a.txt", lambda f: f.write(b"new a"))
    ...     unit.write(folder / "b.txt", lambda f: f.write(b"new b"))
    >>> (folder / "a.txt").read_text(), sorted(p.name for p in folder.iterdir())
    ('new a', ['a.txt', 'b.txt'])
    """
    folder = Path(folder)
    with folder_lock(folder):
        recover(folder)
        unit = Unit(folder)
        try:
            yield unit
        except BaseException:
            unit._discard()
            raise
        try:
            unit._commit()
        except BaseException:
            if not (folder / JOURNAL_NAME).exists():
                unit._discard()
            raise


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path to write ``path`` through; committed (as a unit of one file) when the block succeeds.

    >>> import tempfile, pathlib
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
    >>> with atomic_path(target) as tmp:
    ...     _ = tmp.write_text("done")
    >>> target.read_text()
    'done'
    """
    target = Path(path)
    with commit_unit(target.parent) as unit:
        yield unit.stage(target)
