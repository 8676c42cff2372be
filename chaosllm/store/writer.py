"""Writing recordings: ``<root>/<scenario>/<NNNN>.json``, numbered race-free, atomically.

Theory of operation
-------------------
A recording is serialised completely, redacted once more as text (configured
secrets and key shapes: a last line of defence), written to a hidden temporary
file in the scenario directory (``.chaosllm-<pid>-<random>.tmp``: the loader
skips names that start with a dot or do not end in ``.json``) and fsynced.
Only then does it get its name: under the writer's lock the next number is
taken from a per-scenario counter (initialised by scanning the directory
once), and the temporary file is hard-linked to ``NNNN.json``. ``link`` fails
when the name exists, so two writers -- threads of this process, or other
processes writing to the same directory -- never overwrite each other's files;
the loser takes the next number. The temporary name is then unlinked and the
directory fsynced.

A writer killed at any point leaves either no ``NNNN.json`` or a complete one,
plus at most a hidden temporary file, which the next writer in that directory
deletes once its process is gone. On filesystems without hard links the
writer falls back to ``os.replace`` after checking the name is free (atomic,
race-free between this process's threads, not between processes).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import threading
from dataclasses import replace
from pathlib import Path

from chaosllm.errors import UnsafePath
from chaosllm.model import Exchange
from chaosllm.store.recordings import exchange_to_json, safe_child
from chaosllm.store.redact import Redactor, kept_response_headers

__all__ = ["TEMP_PREFIX", "RecordingWriter", "serialise"]

TEMP_PREFIX = ".chaosllm-"
_NUMBERED = re.compile(r"(\d+)\.json")
_TEMP = re.compile(re.escape(TEMP_PREFIX) + r"(\d+)-[0-9a-f]+\.tmp")


def serialise(exchange: Exchange, redactor: Redactor | None = None) -> str:
    """The text of a recording file: indented, sorted keys, only kept response headers."""
    exchange = replace(
        exchange,
        response=replace(
            exchange.response, headers=kept_response_headers(exchange.response.headers)
        ),
    )
    text = (
        json.dumps(exchange_to_json(exchange), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    )
    return redactor.text(text) if redactor is not None else text


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists
        return True
    return True


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


class RecordingWriter:
    """Writes exchanges under `root`; thread-safe. ``write`` raises `OSError` when the
    disk refuses (full, read-only, permissions) and `UnsafePath` for a bad scenario."""

    def __init__(self, root: Path, *, redactor: Redactor | None = None) -> None:
        self.root = Path(root)
        self.redactor = redactor
        self._lock = threading.Lock()
        self._next: dict[Path, int] = {}

    def scenario_dir(self, scenario: str) -> Path:
        try:
            directory = safe_child(self.root, scenario)
        except UnsafePath as exc:
            raise UnsafePath(f"bad scenario name: {exc}") from None
        if any(part.startswith(".") for part in Path(scenario).parts):
            raise UnsafePath(
                f"scenario {scenario!r}: hidden names are not loaded, so "
                f"they cannot hold recordings"
            )
        return directory

    def write(self, exchange: Exchange, scenario: str) -> Exchange:
        """Write `exchange` as the next recording of `scenario`; the exchange as stored
        (its `name`, `scenario` and `source` set)."""
        self.scenario_dir(scenario)  # UnsafePath before anything is serialised
        target = self.write_text(serialise(exchange, self.redactor), scenario)
        name = f"{scenario}/{target.stem}"
        return replace(exchange, name=name, scenario=scenario, source=str(target))

    def write_text(self, text: str, scenario: str) -> Path:
        """Write a recording already serialised (a session's) as the next file of
        `scenario`, atomically; its path."""
        directory = self.scenario_dir(scenario)
        directory.mkdir(parents=True, exist_ok=True)
        temp = self._write_temp(directory, text.encode("utf-8"))
        try:
            target = self._publish(directory, temp)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
        _fsync_dir(directory)
        return target

    # -- steps ----------------------------------------------------------------------

    @staticmethod
    def _write_temp(directory: Path, data: bytes) -> Path:
        temp = directory / f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(8)}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        os.close(fd)
        return temp

    def _publish(self, directory: Path, temp: Path) -> Path:
        with self._lock:
            number = self._next.get(directory)
            if number is None:
                number = self._scan(directory)
            while True:
                target = directory / f"{number:04d}.json"
                try:
                    os.link(temp, target)
                    break
                except FileExistsError:
                    number += 1
                except OSError as exc:
                    if exc.errno not in (
                        errno.EPERM,
                        errno.ENOTSUP,
                        errno.EOPNOTSUPP,
                        errno.EXDEV,
                        errno.EMLINK,
                    ):
                        raise
                    # No hard links here: the lock keeps this process's threads apart.
                    if target.exists():
                        number += 1
                        continue
                    os.replace(temp, target)
                    break
            self._next[directory] = number + 1
            return target

    @staticmethod
    def _scan(directory: Path) -> int:
        """The number after the highest ``NNNN.json``; stale temporary files of dead
        writers are deleted on the way."""
        highest = 0
        with os.scandir(directory) as entries:
            for entry in entries:
                numbered = _NUMBERED.fullmatch(entry.name)
                if numbered:
                    highest = max(highest, int(numbered.group(1)))
                    continue
                temp = _TEMP.fullmatch(entry.name)
                if temp and not _pid_alive(int(temp.group(1))):
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)
        return highest + 1
