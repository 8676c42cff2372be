"""The load cache: recordings loaded before, kept outside the recordings directory, so
that a server started again over the same files does not parse and digest them again.

`RecordingStore` (`chaosllm.store.recordings`) walks its directories as it always does
and asks the cache, file by file, for the exchanges it loaded from that file before. An
answer is only given for a file whose size, modification and change times (in
nanoseconds) and inode are exactly those it had when it was loaded; any other file (new,
changed, touched, renamed over) is read, parsed and digested as if there were no cache,
and a file that cannot be read is never cached (it is read again, and gives the same
error, every time). The cache is one JSON file per recordings directory (its spelling
and the working directory it is relative to), written atomically under
`default_directory` (``$CHAOSLLM_CACHE_DIR``, else ``$XDG_CACHE_HOME/chaosllm``, else
``~/.cache/chaosllm``), readable by its owner only, and ignored (then rewritten) when it
is corrupt, was written by other code (a fingerprint of chaosllm's own sources), is not
owned by the user or can be written by others. ``CHAOSLLM_NO_CACHE=1`` turns it off.

What it holds is what the recordings hold (which are redacted when recorded): nothing
else. An exchange is only cached when it reads back from the cache equal to the one
parsed from its file (a value JSON cannot carry exactly is not cached), and a file
modified less than `RACY_NS` before its load is not cached yet (a file system's clock
may be too coarse to tell two writes that close apart, as git knows). Bounded: a
directory with fewer than `RecordingsCache.min_files` files is not cached (parsing them
is as quick as reading a cache), and the cache keeps at most `max_files` files and
`max_bytes` bytes, the least recently written going first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaosllm.model import Exchange, RecordedChunk, RecordedRequest, RecordedResponse

__all__ = [
    "CACHE_DIR_ENV",
    "NO_CACHE_ENV",
    "RACY_NS",
    "CacheSnapshot",
    "FileKey",
    "RecordingsCache",
    "decode_exchange",
    "default_cache",
    "default_directory",
    "encode_exchange",
    "file_key",
]

CACHE_DIR_ENV = "CHAOSLLM_CACHE_DIR"
"""Where the load cache is kept (overrides the user's cache directory)."""
NO_CACHE_ENV = "CHAOSLLM_NO_CACHE"
"""Set (non-empty, not ``0``) to load every recording from its file, without the cache."""
RACY_NS = 2_000_000_000
"""A file modified less than this before its load (or after) is not cached yet."""

_FORMAT = 1
_SUFFIX = ".cache"

FileKey = tuple[int, int, int, int]
"""What a cached file must still be: size, modification time, change time (ns), inode."""


def file_key(info: os.stat_result) -> FileKey:
    return (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino)


def default_directory() -> Path:
    """``$CHAOSLLM_CACHE_DIR``, else the user's cache directory's ``chaosllm``."""
    given = os.environ.get(CACHE_DIR_ENV)
    if given:
        return Path(given)
    if sys.platform == "win32":  # pragma: no cover - not run on the CI's platform
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / "chaosllm" / "Cache"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base_dir = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base_dir / "chaosllm"


def default_cache() -> RecordingsCache | None:
    """The cache `RecordingStore.load` uses by default: under `default_directory`, or
    None when ``CHAOSLLM_NO_CACHE`` is set."""
    if os.environ.get(NO_CACHE_ENV, "") not in ("", "0"):
        return None
    try:
        return RecordingsCache(default_directory() / "recordings")
    except RuntimeError:  # no home directory to put it in
        return None


# -- the cached form of an exchange -------------------------------------------------------


_OWN_FIELDS = ("digest", "name", "scenario", "meta", "source", "stored_digest", "keyed_by")
"""The fields of an `Exchange` after its request and response, in the array's order."""


def encode_exchange(exchange: Exchange) -> list[Any]:
    """An exchange as a JSON array (`decode_exchange` is the inverse)."""
    request, response = exchange.request, exchange.response
    chunks = response.chunks
    return [
        exchange.provider,
        request.method,
        request.path,
        request.body,
        response.status,
        response.body,
        response.stream,
        None if chunks is None else [[c.data, c.delay_ms] for c in chunks],
        [list(h) for h in response.headers],
        *(getattr(exchange, name) for name in _OWN_FIELDS),
    ]


def decode_exchange(item: Sequence[Any]) -> Exchange:
    provider, method, path, body, status, response_body, stream, chunks, headers, *own = item
    return Exchange(
        provider,
        RecordedRequest(method, path, body),
        RecordedResponse(
            status,
            response_body,
            stream,
            None if chunks is None else tuple([RecordedChunk(d, t) for d, t in chunks]),
            tuple([(k, v) for k, v in headers]),
        ),
        **dict(zip(_OWN_FIELDS, own, strict=True)),
    )


def _round_trip(exchanges: list[Exchange]) -> str | None:
    """The cached form of a file's exchanges (JSON text), or None when it would not read
    back equal to them (a value JSON cannot carry exactly)."""
    try:
        encoded = json.dumps([encode_exchange(e) for e in exchanges], separators=(",", ":"))
        same = [decode_exchange(i) for i in json.loads(encoded)] == exchanges
    except (TypeError, ValueError, RecursionError):
        return None
    return encoded if same else None


# -- the cache ---------------------------------------------------------------------------


_CODE = ("model.py", "errors.py", "paths.py", "store", "providers")
"""What decides the exchanges read from a file (chaosllm's modules and packages)."""


def _fingerprint() -> str:
    """Of the code that parses and digests recordings (`_CODE`: each source file's size
    and modification time), the Python version and the cache's format."""
    package = Path(__file__).resolve().parent.parent
    files: list[str] = []
    for name in _CODE:
        top = os.path.join(package, name)
        if not os.path.isdir(top):
            files.append(top)
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            files.extend(os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py"))
    parts = [f"{_FORMAT}:{sys.version}"]
    for file in files:
        try:
            info = os.stat(file)
        except OSError:
            continue
        parts.append(f"{file}:{info.st_size}:{info.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode("utf-8", "surrogatepass")).hexdigest()


_FINGERPRINT: list[str] = []


def _code() -> str:
    if not _FINGERPRINT:
        _FINGERPRINT.append(_fingerprint())
    return _FINGERPRINT[0]


@dataclass
class CacheSnapshot:
    """What the cache holds for one recordings directory, and what this load adds to it."""

    root: str
    files: dict[str, list[Any]] = field(default_factory=dict)
    """Path (as walked) -> ``[file key, [encoded exchange, ...]]``, from the cache."""
    started_ns: int = 0
    """When the load began (wall clock): files modified after ``started_ns - RACY_NS`` are
    not cached."""
    fresh: dict[str, tuple[list[int], list[Any] | str]] = field(default_factory=dict)
    """The entries this load verified and will write: the file key and the encoded
    exchanges (as read from the cache, or as JSON text)."""
    seen: int = 0
    """How many of the cached entries this load found still valid."""
    dropped: bool = False
    """Whether an entry of the cache is stale (a file changed or gone)."""

    def get(self, path: str, info: os.stat_result) -> list[Exchange] | None:
        """The exchanges cached for `path` if it is exactly as cached (`info`), else None."""
        entry = self.files.get(path)
        if entry is None:
            return None
        key = entry[0]
        if (
            len(key) != 4
            or key[0] != info.st_size
            or key[1] != info.st_mtime_ns
            or key[2] != info.st_ctime_ns
            or key[3] != info.st_ino
        ):
            self.dropped = True
            return None
        try:
            exchanges = [decode_exchange(item) for item in entry[1]]
        except (TypeError, ValueError):  # a cache written by hand: distrust it
            self.dropped = True
            return None
        self.fresh[path] = (key, entry[1])
        self.seen += 1
        return exchanges

    def add(self, path: str, info: os.stat_result, exchanges: list[Exchange]) -> None:
        """Exchanges just parsed from `path` (stat'd as `info` before it was read)."""
        if info.st_mtime_ns >= self.started_ns - RACY_NS:
            self.dropped = True  # too recent to tell a later write apart: next time
            return
        encoded = _round_trip(exchanges)
        if encoded is not None:
            self.fresh[path] = (list(file_key(info)), encoded)
        else:
            self.dropped = True

    @property
    def changed(self) -> bool:
        """Whether the cache should be written again."""
        return self.dropped or len(self.fresh) != self.seen or self.seen != len(self.files)


class RecordingsCache:
    """The load cache in one directory (module docstring)."""

    def __init__(
        self,
        directory: Path,
        *,
        min_files: int = 256,
        max_files: int = 16,
        max_bytes: int = 512 << 20,
    ) -> None:
        self.directory = Path(directory)
        self.min_files = min_files
        self.max_files = max_files
        self.max_bytes = max_bytes

    def file_for(self, root: str) -> Path:
        """The cache file of a recordings directory as spelt (and the working directory
        a relative spelling depends on)."""
        where = root if os.path.isabs(root) else os.path.join(os.getcwd(), root)
        name = hashlib.sha256(f"{where}\x00{root}".encode("utf-8", "surrogatepass")).hexdigest()
        return self.directory / f"{name[:32]}{_SUFFIX}"

    def usable_for(self, root: str) -> bool:
        """Whether the cache may serve `root`: not when it would sit inside it."""
        try:
            top = os.path.realpath(root)
            mine = os.path.realpath(self.directory)
        except (OSError, ValueError):
            return False
        return not (mine == top or mine.startswith(top.rstrip(os.sep) + os.sep))

    def read(self, root: str) -> CacheSnapshot:
        """What the cache holds for `root` (nothing when it is missing, corrupt, stale or
        not to be trusted)."""
        snapshot = CacheSnapshot(root=root, started_ns=time.time_ns())
        path = self.file_for(root)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            return snapshot
        try:
            info = os.fstat(fd)
            if not _trusted(info):
                snapshot.dropped = True
                return snapshot
            with os.fdopen(fd, "rb", closefd=False) as fh:
                raw = fh.read()
        except OSError:
            snapshot.dropped = True
            return snapshot
        finally:
            os.close(fd)
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            snapshot.dropped = True
            return snapshot
        if (
            not isinstance(data, dict)
            or data.get("chaosllm_cache") != _FORMAT
            or data.get("code") != _code()
            or data.get("root") != root
            or not isinstance(data.get("files"), dict)
        ):
            snapshot.dropped = True
            return snapshot
        files: dict[str, list[Any]] = {
            name: entry
            for name, entry in data["files"].items()
            if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], list)
            if isinstance(entry[1], list)
        }
        snapshot.files = files
        snapshot.dropped = len(files) != len(data["files"])
        return snapshot

    def write(self, snapshot: CacheSnapshot) -> bool:
        """Write what `snapshot` verified (when it changed and is worth caching); whether
        it was written. Never raises for a file system that refuses."""
        if not snapshot.changed:
            return False
        path = self.file_for(snapshot.root)
        if len(snapshot.fresh) < self.min_files:
            if snapshot.files:  # what was cached no longer applies
                _remove(path)
            return False
        head = json.dumps(
            {
                "chaosllm_cache": _FORMAT,
                "code": _code(),
                "root": snapshot.root,
                "written_ns": time.time_ns(),
            },
            separators=(",", ":"),
        )
        entries = ",".join(
            f"{json.dumps(path)}:[{json.dumps(key)},"
            f"{items if isinstance(items, str) else json.dumps(items, separators=(',', ':'))}]"
            for path, (key, items) in snapshot.fresh.items()
        )
        payload = f'{head[:-1]},"files":{{{entries}}}}}'.encode("ascii")
        if len(payload) > self.max_bytes:
            _remove(path)
            return False
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(payload)
                os.replace(temp, path)
            except BaseException:
                _remove(temp)
                raise
        except OSError:
            return False
        self._bound(keep=path)
        return True

    def _bound(self, keep: Path) -> None:
        """At most `max_files` cache files of at most `max_bytes` in all: the least
        recently written go first (never `keep`, just written)."""
        try:
            found = [
                (entry.stat().st_mtime_ns, entry.stat().st_size, Path(entry.path))
                for entry in os.scandir(self.directory)
                if entry.name.endswith(_SUFFIX) and entry.is_file(follow_symlinks=False)
            ]
        except OSError:
            return
        found.sort(reverse=True)  # newest first
        total = 0
        for i, (_, size, path) in enumerate(found):
            total += size
            if path != keep and (i >= self.max_files or total > self.max_bytes):
                _remove(path)
                total -= size


def _trusted(info: os.stat_result) -> bool:
    """A regular file of the user's, which nobody else can write."""
    if not stat.S_ISREG(info.st_mode) or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return False
    getuid = getattr(os, "getuid", None)
    return getuid is None or info.st_uid == getuid()


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
