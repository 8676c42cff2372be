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
``~/.cache/chaosllm``), readable by its owner only, and ignored whole (then rewritten)
when it is corrupt (one CRC-32 covers its heads and its bodies), was written by other
code (a fingerprint of chaosllm's own sources), is not owned by the user or can be
written by others. It is written through a fresh temporary file (``mkstemp``:
``O_CREAT|O_EXCL|O_NOFOLLOW``, mode 0600) in a directory of the user's that nobody else
can enter (made 0700, and checked: no cache is written into a directory someone else
owns or a symlink), then renamed into place. ``CHAOSLLM_NO_CACHE=1`` turns it off.

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
import tempfile
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, SupportsIndex, TypeGuard

from chaosllm.errors import RecordingError
from chaosllm.model import Exchange, RecordedChunk, RecordedRequest, RecordedResponse

__all__ = [
    "CACHE_DIR_ENV",
    "NO_CACHE_ENV",
    "RACY_NS",
    "CacheSnapshot",
    "CachedExchange",
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

_FORMAT = 3
_SUFFIX = ".cache"
_CHECK = 9
"""The first line's length: the CRC-32 of the rest, 8 hex digits and a newline."""

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
"""The fields of an `Exchange` besides its provider, request and response, in the order a
cached head holds them."""

_REQUEST = Exchange.__dict__["request"]
"""`Exchange`'s own slot (a `CachedExchange` reads it past its property)."""


def encode_exchange(exchange: Exchange) -> tuple[list[Any], bytes]:
    """An exchange in its cached form: its head (a JSON array of the provider and
    `_OWN_FIELDS`, what indexing needs) and its body (the request and the response, the
    bulk, as JSON bytes decoded only when first used). `decode_exchange` is the inverse."""
    request, response = exchange.request, exchange.response
    chunks = response.chunks
    body = [
        request.method,
        request.path,
        request.body,
        response.status,
        response.body,
        response.stream,
        None if chunks is None else [[c.data, c.delay_ms] for c in chunks],
        [list(h) for h in response.headers],
    ]
    head = [exchange.provider, *(getattr(exchange, name) for name in _OWN_FIELDS)]
    return head, json.dumps(body, separators=(",", ":")).encode("ascii")


def _parts(body: bytes) -> tuple[RecordedRequest, RecordedResponse]:
    method, path, request_body, status, response_body, stream, chunks, headers = json.loads(body)
    return (
        RecordedRequest(method, path, request_body),
        RecordedResponse(
            status,
            response_body,
            stream,
            None if chunks is None else tuple([RecordedChunk(d, t) for d, t in chunks]),
            tuple([(k, v) for k, v in headers]),
        ),
    )


def decode_exchange(head: Sequence[Any], body: bytes) -> Exchange:
    """The exchange `encode_exchange` gave `head` and `body` for, decoded at once."""
    request, response = _parts(body)
    return Exchange(head[0], request, response, *head[1:])


_FIELDS = ("provider", "request", "response", *_OWN_FIELDS)
"""`Exchange`'s fields, in order (a test pins them: `CachedExchange.pending` sets each)."""
_SET_PROVIDER, _SET_REQUEST, _SET_RESPONSE, *_SET_OWN = (
    Exchange.__dict__[name].__set__ for name in _FIELDS
)
_SET_DIGEST, _SET_NAME, _SET_SCENARIO, _SET_META, _SET_SOURCE, _SET_STORED, _SET_KEYED = _SET_OWN


class CachedExchange(Exchange):
    """An exchange read from the cache whose request and response (the bulk of it) are
    decoded from the cache's bytes the first time either is read (until then both of its
    slots hold where they lie: the cache's bytes, start, end): a server started over
    10k recordings builds 10k heads, not 10k bodies, and most are never asked for. Once
    decoded it becomes a plain `Exchange` (its class is set back), so reading it costs
    what reading any exchange costs. Equal to the `Exchange` it encodes."""

    __slots__ = ()

    @classmethod
    def pending(cls, head: list[Any], data: bytes, base: int) -> Exchange:
        """The exchange of a cached `head` (`_valid_head`) whose body lies in `data`, from
        `base` on. Its slots are set one by one, past the frozen dataclass's ``__init__``
        (a fifth of its cost: this runs once per recording at start-up)."""
        exchange = object.__new__(cls)
        where = (data, base + head[8], base + head[9])
        _SET_PROVIDER(exchange, head[0])
        _SET_REQUEST(exchange, where)
        _SET_RESPONSE(exchange, where)
        _SET_DIGEST(exchange, head[1])
        _SET_NAME(exchange, head[2])
        _SET_SCENARIO(exchange, head[3])
        _SET_META(exchange, head[4])
        _SET_SOURCE(exchange, head[5])
        _SET_STORED(exchange, head[6])
        _SET_KEYED(exchange, head[7])
        return exchange

    def _decoded(self) -> Exchange:
        """Itself, decoded (then a plain `Exchange`). Two threads decoding it at once
        each set the same values."""
        where = _REQUEST.__get__(self, Exchange)
        if type(where) is tuple:
            data, start, end = where
            try:
                request, response = _parts(data[start:end])
            except (TypeError, ValueError, RecursionError) as exc:  # pragma: no cover
                raise RecordingError(
                    self.source or self.name,
                    f"its entry in the load cache cannot be read ({exc}); remove the cache "
                    f"(see `chaosllm.store.cache`) or set {NO_CACHE_ENV}=1",
                ) from exc
            # The response first: a request slot that no longer holds where they lie
            # tells another thread reading it at the same time that both are set.
            _SET_RESPONSE(self, response)
            _SET_REQUEST(self, request)
        object.__setattr__(self, "__class__", Exchange)
        return self

    @property
    def request(self) -> RecordedRequest:
        return self._decoded().request

    @property
    def response(self) -> RecordedResponse:
        return self._decoded().response

    def __eq__(self, other: object) -> bool:
        return self._decoded() == other

    __hash__ = Exchange.__hash__

    def __reduce_ex__(self, protocol: SupportsIndex) -> str | tuple[Any, ...]:
        return self._decoded().__reduce_ex__(protocol)  # copied or pickled: a plain one

    def __repr__(self) -> str:
        return repr(self._decoded())


def _round_trip(exchanges: list[Exchange]) -> list[tuple[list[Any], bytes]] | None:
    """The cached form of a file's exchanges, or None when it would not read back equal
    to them (a value JSON cannot carry exactly)."""
    try:
        encoded = [encode_exchange(e) for e in exchanges]
        heads = json.loads(json.dumps([head for head, _ in encoded]))
        same = [decode_exchange(h, b) for h, (_, b) in zip(heads, encoded, strict=True)]
    except (TypeError, ValueError, RecursionError):
        return None
    return encoded if same == exchanges else None


def _valid_head(head: Any, size: int) -> TypeGuard[list[Any]]:
    """A cached head of the right shape, whose body lies within the cache's `size` bytes."""
    return (
        type(head) is list
        and len(head) == _HEAD_LENGTH
        and type(head[0]) is str
        and type(head[1]) is str
        and type(head[2]) is str
        and type(head[3]) is str
        and type(head[4]) is dict
        and (head[5] is None or type(head[5]) is str)
        and (head[6] is None or type(head[6]) is str)
        and type(head[7]) is str
        and type(head[8]) is int
        and type(head[9]) is int
        and 0 <= head[8] <= head[9] <= size
    )


_HEAD_LENGTH = 1 + len(_OWN_FIELDS) + 2
"""provider, `_OWN_FIELDS`, and where the body starts and ends in the cache's bodies."""


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
    """Path (as walked) -> ``[file key, [head, ...]]``, from the cache (each head ends with
    where its body lies among the bodies, which start at `base` in `data`)."""
    data: bytes = b""
    """The cache file as read."""
    base: int = 0
    started_ns: int = 0
    """When the load began (wall clock): files modified after ``started_ns - RACY_NS`` are
    not cached."""
    kept: dict[str, list[Any]] = field(default_factory=dict)
    """The entries of `files` this load found still valid (to be written again)."""
    fresh: dict[str, tuple[list[int], list[tuple[list[Any], bytes]]]] = field(default_factory=dict)
    """The files this load parsed and verified: the file key and each exchange's head
    (without its body's place) and body."""
    dropped: bool = False
    """Whether an entry of the cache is stale (a file changed or gone)."""

    def get(self, path: str, info: os.stat_result) -> list[Exchange] | None:
        """The exchanges cached for `path` if it is exactly as cached (`info`), else None.
        Their requests and responses are decoded when first read (`CachedExchange`)."""
        entry = self.files.get(path)
        if entry is None:
            return None
        key, heads = entry
        if key != [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino] or (
            type(heads) is not list
        ):
            self.dropped = True
            return None
        data, base = self.data, self.base
        size, pending = len(data) - base, CachedExchange.pending
        found: list[Exchange] = []
        for head in heads:
            if not _valid_head(head, size):
                self.dropped = True  # a cache written by hand: distrust it
                return None
            found.append(pending(head, data, base))
        self.kept[path] = entry
        return found

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
        return self.dropped or bool(self.fresh) or len(self.kept) != len(self.files)

    def entries(self) -> Iterator[tuple[str, list[int], list[tuple[list[Any], bytes]]]]:
        """What to write: each file's key, and its exchanges' heads and bodies."""
        data, base = self.data, self.base
        for path, (key, heads) in self.kept.items():
            yield path, key, [(h[:-2], data[base + h[-2] : base + h[-1]]) for h in heads]
        for path, (key, items) in self.fresh.items():
            yield path, key, items


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
        not to be trusted). A cache file is a line with the CRC-32 (8 hex digits) of all
        that follows it, a line of JSON (what it is for, the heads of its exchanges and the
        length of the bodies) and the bodies."""
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
        end = raw.find(b"\n", _CHECK)
        try:
            check = int(raw[: _CHECK - 1], 16) if raw[_CHECK - 1 : _CHECK] == b"\n" else -1
            whole = check == zlib.crc32(memoryview(raw)[_CHECK:])
            data = json.loads(raw[_CHECK:end]) if end >= 0 and whole else None
        except (ValueError, RecursionError):
            data = None
        base = end + 1
        if (
            not isinstance(data, dict)
            or data.get("chaosllm_cache") != _FORMAT
            or data.get("code") != _code()
            or data.get("root") != root
            or not isinstance(data.get("files"), dict)
            or data.get("bodies") != len(raw) - base
        ):
            snapshot.dropped = True
            return snapshot
        files: dict[str, list[Any]] = {
            name: entry
            for name, entry in data["files"].items()
            if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], list)
        }
        snapshot.files = files
        snapshot.data = raw
        snapshot.base = base
        snapshot.dropped = len(files) != len(data["files"])
        return snapshot

    def write(self, snapshot: CacheSnapshot) -> bool:
        """Write what `snapshot` verified (when it changed and is worth caching); whether
        it was written. Never raises for a file system that refuses."""
        if not snapshot.changed:
            return False
        path = self.file_for(snapshot.root)
        if len(snapshot.kept) + len(snapshot.fresh) < self.min_files:
            if snapshot.files:  # what was cached no longer applies
                _remove(path)
            return False
        bodies: list[bytes] = []
        at = 0
        files: dict[str, list[Any]] = {}
        for name, key, items in snapshot.entries():
            heads = []
            for own, body in items:
                bodies.append(body)
                heads.append([*own, at, at + len(body)])
                at += len(body)
            files[name] = [key, heads]
        blob = b"".join(bodies)
        head: dict[str, Any] = {
            "chaosllm_cache": _FORMAT,
            "code": _code(),
            "root": snapshot.root,
            "written_ns": time.time_ns(),
            "bodies": len(blob),
            "files": files,
        }
        try:
            first = json.dumps(head, separators=(",", ":")).encode("ascii")
        except (TypeError, ValueError, RecursionError):  # pragma: no cover - verified heads
            return False
        if _CHECK + len(first) + 1 + len(blob) > self.max_bytes:
            _remove(path)
            return False
        check = zlib.crc32(blob, zlib.crc32(first + b"\n"))
        try:
            if not self._own_directory():
                return False
            # mkstemp: a new name, O_CREAT | O_EXCL | O_NOFOLLOW, mode 0600.
            fd, temp = tempfile.mkstemp(dir=self.directory, prefix=f".{path.name}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(b"%08x\n" % check)
                    fh.write(first)
                    fh.write(b"\n")
                    fh.write(blob)
                os.replace(temp, path)
            except BaseException:
                _remove(Path(temp))
                raise
        except OSError:
            return False
        self._bound(keep=path)
        return True

    def _own_directory(self) -> bool:
        """Make the cache directory (0700) if it is missing; whether it is a real
        directory of the user's that nobody else can enter (one that is the user's but
        open to others is closed first)."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.lstat(self.directory)
        getuid = getattr(os, "getuid", None)
        if not stat.S_ISDIR(info.st_mode) or (getuid is not None and info.st_uid != getuid()):
            return False
        if info.st_mode & 0o077:
            os.chmod(self.directory, 0o700)
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
