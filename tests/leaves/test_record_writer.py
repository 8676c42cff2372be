"""RecordingWriter: race-free numbering, atomic writes, nothing secret on disk."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from chaosllm.errors import UnsafePath
from chaosllm.model import Exchange
from chaosllm.store.recordings import RecordingStore, parse_exchange
from chaosllm.store.redact import Redactor
from chaosllm.store.writer import TEMP_PREFIX, RecordingWriter
from tests.helpers import RECORDINGS, ROOT, recording

KEY = "sk-proj-" + "Q" * 40


def exchange(name: str = "simple-chat/0001") -> Exchange:
    return parse_exchange(recording(name), source="test", scenario="x", name="x/0")


def numbered(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))


def test_recordings_are_numbered_in_order_and_round_trip(tmp_path: Path) -> None:
    writer = RecordingWriter(tmp_path)
    stored = [
        writer.write(exchange(n), "chat")
        for n in ("simple-chat/0001", "streaming-tools/0001", "knowledge/0004")
    ]
    assert [s.name for s in stored] == ["chat/0001", "chat/0002", "chat/0003"]
    assert numbered(tmp_path / "chat") == ["0001.json", "0002.json", "0003.json"]
    store = RecordingStore.load([tmp_path])
    assert store.errors == []
    for original, loaded in zip(stored, store.exchanges, strict=True):
        assert loaded.name == original.name and loaded.source == original.source
        assert loaded.response == original.response and loaded.request == original.request
        assert loaded.digest == loaded.stored_digest == original.digest
    text = (tmp_path / "chat" / "0001.json").read_text("utf-8")
    assert text.startswith('{\n  "chaosllm": 1,') and text.endswith("}\n")


def test_numbering_continues_after_existing_files(tmp_path: Path) -> None:
    (tmp_path / "chat").mkdir()
    (tmp_path / "chat" / "0007.json").write_text(json.dumps(recording("simple-chat/0001")))
    (tmp_path / "chat" / "notes.json").write_text("{}")
    assert RecordingWriter(tmp_path).write(exchange(), "chat").name == "chat/0008"


def test_concurrent_writers_never_share_a_number(tmp_path: Path) -> None:
    # Two writers on one directory stand for two processes: the counter of one is stale,
    # the hard link refuses to overwrite, the loser takes the next number.
    writers = [RecordingWriter(tmp_path), RecordingWriter(tmp_path)]
    names: list[str] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            stored = writers[i % 2].write(exchange(), "busy")
            with lock:
                names.append(stored.name)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == []
    assert sorted(names) == [f"busy/{i:04d}" for i in range(1, 41)]
    assert numbered(tmp_path / "busy") == [f"{i:04d}.json" for i in range(1, 41)]
    assert RecordingStore.load([tmp_path]).errors == []


def test_no_header_or_key_reaches_the_file(tmp_path: Path) -> None:
    base = exchange()
    leaky = replace(
        base,
        response=replace(
            base.response,
            headers=(
                ("authorization", f"Bearer {KEY}"),
                ("set-cookie", "session=abc"),
                ("x-request-id", "req_1"),
            ),
        ),
        meta={"description": f"made with {KEY}"},
    )
    stored = RecordingWriter(tmp_path, redactor=Redactor(["hunter2"])).write(leaky, "s")
    text = Path(stored.source or "").read_text("utf-8")
    assert KEY not in text and "Bearer" not in text and "session=abc" not in text
    assert json.loads(text)["response"]["headers"] == {"x-request-id": "req_1"}


@pytest.mark.parametrize("scenario", ["../escape", "/abs/path", ".hidden", "a/../../b", ""])
def test_unsafe_scenarios_are_refused(tmp_path: Path, scenario: str) -> None:
    with pytest.raises(UnsafePath):
        RecordingWriter(tmp_path / "root").write(exchange(), scenario)
    assert not (tmp_path / "escape").exists()


def test_an_unwritable_directory_is_a_clear_os_error(tmp_path: Path) -> None:
    (tmp_path / "blocked").write_text("a file where the scenario directory should be")
    with pytest.raises(OSError):
        RecordingWriter(tmp_path).write(exchange(), "blocked")


# -- a recorder killed with SIGKILL ------------------------------------------------------

WRITER_SCRIPT = textwrap.dedent("""
    import json, os, signal, sys
    from dataclasses import replace
    from pathlib import Path
    from chaosllm.store.writer import RecordingWriter
    from chaosllm.store.recordings import parse_exchange

    root, mode = Path(sys.argv[1]), sys.argv[2]
    data = json.loads(Path(sys.argv[3]).read_text("utf-8"))
    base = parse_exchange(data, source="x", scenario="x", name="x/0")
    big = replace(base, response=replace(base.response, body={
        **base.response.body, "padding": "x" * 4_000_000}))
    if mode != "loop":
        # Die at a precise point of the write: after the temporary file is written (link)
        # or before it is synced (fsync).
        def die(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)
        setattr(os, mode, die)
    writer = RecordingWriter(root)
    while True:
        print("writing", flush=True)
        writer.write(big, "killed")
""")


def run_writer(root: Path, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            WRITER_SCRIPT,
            str(root),
            mode,
            str(RECORDINGS / "simple-chat" / "0001.json"),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def assert_no_partial_recording(root: Path) -> None:
    store = RecordingStore.load([root])
    assert store.errors == []
    directory = root / "killed"
    for path in directory.glob("*.json"):
        assert not path.name.startswith(".")
        data = json.loads(path.read_text("utf-8"))
        assert len(data["response"]["body"]["padding"]) == 4_000_000
    leftovers = [p.name for p in directory.iterdir() if not p.name.endswith(".json")]
    assert all(name.startswith(TEMP_PREFIX) and name.endswith(".tmp") for name in leftovers)


@pytest.mark.parametrize("mode", ["link", "fsync"])
def test_a_writer_killed_mid_write_leaves_no_recording(tmp_path: Path, mode: str) -> None:
    proc = run_writer(tmp_path, mode)
    try:
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.stdout is not None:
            proc.stdout.close()
    directory = tmp_path / "killed"
    assert list(directory.glob("*.json")) == []
    leftovers = list(directory.iterdir())
    assert len(leftovers) == 1 and leftovers[0].name.startswith(TEMP_PREFIX)
    assert_no_partial_recording(tmp_path)
    assert RecordingStore.load([tmp_path]).exchanges == []
    # The next writer numbers from 1 and deletes the dead writer's temporary file.
    assert RecordingWriter(tmp_path).write(exchange(), "killed").name == "killed/0001"
    assert [p.name for p in directory.iterdir()] == ["0001.json"]


def test_a_writer_killed_at_random_moments_leaves_only_complete_recordings(tmp_path: Path) -> None:
    for round_ in range(4):
        proc = run_writer(tmp_path, "loop")
        try:
            assert proc.stdout is not None
            # Kill right after it announces a write (the 2nd, 3rd...: mid-write, or close).
            for _ in range(2 + round_):
                assert proc.stdout.readline() == "writing\n"
            os.kill(proc.pid, signal.SIGKILL)
            assert proc.wait(timeout=30) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
            if proc.stdout is not None:
                proc.stdout.close()
        assert_no_partial_recording(tmp_path)
    names = numbered(tmp_path / "killed")
    assert names == [f"{i:04d}.json" for i in range(1, len(names) + 1)]
