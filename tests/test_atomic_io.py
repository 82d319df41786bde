"""A result, its metadata and its report are one unit: a full disk or an interrupt at any write leaves the
previous result loadable and its page beside it; a second writer is refused; leftovers of killed runs go."""

import errno
import fcntl
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tl_geometry import atomic_io
from tl_geometry.errors import GeometryError
from tl_geometry.report import html
from tl_geometry.results.result import GeometryResult
from tests.fixtures import inject, make_result


class _Fail:
    """A file whose writes fail once ``budget`` bytes have been written in the whole test (a disk filling up)."""

    def __init__(self, f, state, error):
        self.f, self.state, self.error = f, state, error

    def write(self, data):
        if self.state["left"] < len(data):
            raise self.error()
        self.state["left"] -= len(data)
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def failing_writes(monkeypatch, budget, error):
    state = {"left": budget}
    real = inject(monkeypatch, "open_for_writing", lambda path: _Fail(real(path), state, error))


def disk_full():
    return OSError(errno.ENOSPC, "No space left on device")


def snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def results():
    return make_result(), make_result(seed=1)


@pytest.mark.parametrize("error", [disk_full, KeyboardInterrupt, SystemExit], ids=["ENOSPC", "SIGINT", "SIGTERM"])
def test_a_failing_save_leaves_the_previous_result(tmp_path, monkeypatch, results, error):
    old, new = results
    old.save(tmp_path / "r")
    before = snapshot(tmp_path)
    npz_size = (tmp_path / "r.npz").stat().st_size
    # Fail in the npz, right after it, and inside the JSON (the moment the issue describes).
    for budget in (0, npz_size // 2, npz_size, npz_size + 100):
        with monkeypatch.context() as m:
            failing_writes(m, budget, error)
            with pytest.raises((OSError, KeyboardInterrupt, SystemExit)):
                new.save(tmp_path / "r")
        assert snapshot(tmp_path) == before  # no temporary file, no lock, the old files untouched
        assert GeometryResult.load(tmp_path / "r").equals(old)
    new.save(tmp_path / "r")
    assert GeometryResult.load(tmp_path / "r").equals(new)


def test_a_failing_report_leaves_the_previous_page_and_result(tmp_path, monkeypatch, results):
    old, new = results
    html.write_report(old, tmp_path)
    before = snapshot(tmp_path)
    assert set(before) == {"index.html", "result.npz", "result.json"}
    total = sum(len(b) for b in before.values())
    for budget in (0, len(before["result.npz"]) + 10, total - 1000):  # in the npz, the JSON, the page
        with monkeypatch.context() as m:
            failing_writes(m, budget, disk_full)
            with pytest.raises(OSError, match="No space left"):
                html.write_report(new, tmp_path)
        assert snapshot(tmp_path) == before
    html.write_report(new, tmp_path)
    assert GeometryResult.load(tmp_path / "result").equals(new)
    assert snapshot(tmp_path)["index.html"] != before["index.html"]


def test_a_commit_killed_between_its_renames_is_completed(tmp_path, monkeypatch, results):
    old, new = results
    old.save(tmp_path / "r")
    real_replace, calls = os.replace, []

    def killed_after_journal(src, dst):  # a SIGKILL after the journal and the first rename
        calls.append(dst)
        if len(calls) == 3:
            raise SystemExit("killed")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", killed_after_journal)
    with pytest.raises(SystemExit):
        new.save(tmp_path / "r")
    monkeypatch.setattr(os, "replace", real_replace)
    assert (tmp_path / atomic_io.JOURNAL_NAME).exists()
    # A reader sees the new result whole (it follows the journal), without writing anything.
    assert GeometryResult.load(tmp_path / "r").equals(new)
    # The next writer in the folder completes the commit first.
    with atomic_io.commit_unit(tmp_path):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.npz"]
    assert GeometryResult.load(tmp_path / "r").equals(new)


def test_a_second_writer_is_refused_and_a_dead_ones_lock_is_taken_over(tmp_path, results):
    old, _ = results
    lock = tmp_path / atomic_io.LOCK_NAME
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)  # another open file: to flock, another process
    os.write(fd, json.dumps({"pid": 4242, "host": "node7", "since": "now"}).encode())
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(GeometryError, match=r"is being written by another tl-geometry run \(pid 4242 on node7"):
            old.save(tmp_path / "r")
        assert not (tmp_path / "r.npz").exists()
    finally:
        os.close(fd)  # the holder dies: the kernel drops its lock, the file stays
    assert lock.exists()
    old.save(tmp_path / "r")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.npz"]


def test_leftovers_of_a_killed_writer_are_removed(tmp_path, results):
    old, new = results
    old.save(tmp_path / "r")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".r.npz.tlg{dead.pid}.0a1b2c3d.tmp"
    stale.write_bytes(b"half an npz")
    mine = tmp_path / f".r.json.tlg{os.getpid()}.0a1b2c3d.tmp"  # a live writer's: kept
    foreign = tmp_path / f".notes.txt.{dead.pid}.0a1b2c3d.tmp"  # not ours: kept
    foreign.write_bytes(b"someone else's")
    mine.write_bytes(b"{")
    new.save(tmp_path / "r")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["r.json", "r.npz", mine.name, foreign.name])


def test_two_processes_saving_to_one_folder(tmp_path):
    """Two real processes: one commits, the other is refused with a message; the result loads."""
    script = textwrap.dedent(f"""
        import sys
        from tl_geometry import atomic_io
        from tests.fixtures import make_result
        r = make_result(seed=int(sys.argv[1]))
        with atomic_io.folder_lock({str(tmp_path)!r}):
            print("locked", flush=True)
            if sys.argv[2] == "hold":
                sys.stdin.readline()  # until the test says go
            r.save({str(tmp_path / 'r')!r})
    """)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    first = subprocess.Popen([sys.executable, "-c", script, "0", "hold"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env=env)
    assert first.stdout.readline().strip() == "locked"
    second = subprocess.run([sys.executable, "-c", script, "1", "go"], capture_output=True, text=True, env=env)
    first.stdin.close()
    assert first.wait() == 0
    assert second.returncode != 0 and f"pid {first.pid} on" in second.stderr
    assert GeometryResult.load(tmp_path / "r").equals(make_result(seed=0))


def test_the_old_import_path_warns_and_gives_the_same_objects():
    """``tl_geometry.results.files`` (where these lived before) still imports, naming the new home."""
    from tl_geometry.results import files

    for name in ("commit_unit", "atomic_path", "folder_lock", "json_text", "pid_alive", "LOCK_NAME"):
        with pytest.warns(DeprecationWarning, match=rf"import {name} from tl_geometry\.atomic_io"):
            assert getattr(files, name) is getattr(atomic_io, name)
    with pytest.raises(AttributeError, match="_open_for_writing"):
        files._open_for_writing  # noqa: B018 - private names were never a path to keep
