"""The engine's one memo: what a request's stages worked out, kept for the next request
that would work out the same.

Theory of operation. Every entry is keyed by values (a provider's name, a request's
bytes, a recording's name and the rendering's variant), never by an object's identity,
so an equal request finds it whatever object carries it, and a key can never be
reused by another object. Each entry states its size in bytes; the memo is bounded by
entries and by bytes (`DEFAULT_BYTES`, ``--memo-bytes``), the least recently used going
first, and an entry larger than a quarter of the bound is not kept at all.

Entries are of two kinds. A *pure* entry depends on its key alone (a request body parsed
and digested, a recording rendered for a variant): it stays valid whatever the server's
state does. A *stateful* entry (a whole replayed answer) also depends on the server's
state: it is stored with the `StateVersion` it was worked out at and found only while
the version is unchanged. Every state change bumps the version (the board, the matcher
and the engine share one), so no feature has to remember to invalidate the memo: it
only has to bump the version when it changes what an answer depends on, or say, while a
request is worked out, that its answer is not to be kept (`chaosllm.core.call.Request`'s
``keep``). `clear` empties the memo (a reset, a reload).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any, Final

from chaosllm.model import StateVersion

__all__ = ["DEFAULT_BYTES", "DEFAULT_ENTRIES", "Memo"]

DEFAULT_BYTES: Final = 32 << 20
"""The memo's byte bound by default (32 MiB)."""
DEFAULT_ENTRIES: Final = 8192
"""The memo's entry bound by default."""
ENTRY_OVERHEAD: Final = 256
"""What an entry costs besides the bytes it states (its key tuple, its slot)."""

_PURE: Final = -1
"""The version a pure entry is stored with: valid at any version."""


class Memo:
    """A value-keyed, size-bounded memo with a state version (see the module doc).

    Thread-safe: a server's loop thread and a test's thread may use one engine."""

    __slots__ = ("_bytes", "_items", "_lock", "hits", "max_bytes", "max_entries", "version")

    def __init__(
        self,
        version: StateVersion | None = None,
        *,
        max_bytes: int = DEFAULT_BYTES,
        max_entries: int = DEFAULT_ENTRIES,
    ) -> None:
        if max_bytes < 0 or max_entries < 0:
            raise ValueError("the memo's bounds must be >= 0")
        self.version = version if version is not None else StateVersion()
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._items: OrderedDict[Hashable, tuple[int, Any, int]] = OrderedDict()
        """key -> (the version it was stored at or `_PURE`, the value, its size)."""
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0

    @property
    def bytes(self) -> int:
        """What the entries state they hold, overhead included."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: Hashable) -> Any:
        """The value kept for `key` that is still valid (pure, or stored at the current
        version), else None."""
        # Without the lock: a dict read is atomic, and an entry dropped meanwhile by
        # another thread is only not made the most recently used.
        item = self._items.get(key)
        if item is None:
            return None
        if item[0] != _PURE and item[0] != self.version.value:
            with self._lock:
                if self._items.get(key) is item:
                    self._drop(key)
            return None
        try:  # noqa: SIM105 (contextlib.suppress costs a context manager per hit)
            self._items.move_to_end(key)
        except KeyError:
            pass
        self.hits += 1
        return item[1]

    def put(self, key: Hashable, value: Any, size: int, *, stateful: bool = False) -> None:
        """Keep `value` for `key` (`size`: the bytes it holds, its key's included); a
        `stateful` one only for the current version."""
        cost = size + ENTRY_OVERHEAD
        if cost * 4 > self.max_bytes or not self.max_entries:
            return
        with self._lock:
            if key in self._items:
                self._drop(key)
            self._items[key] = (self.version.value if stateful else _PURE, value, cost)
            self._bytes += cost
            items = self._items
            while len(items) > self.max_entries or self._bytes > self.max_bytes:
                self._drop(next(iter(items)))

    def _drop(self, key: Hashable) -> None:
        item = self._items.pop(key)
        self._bytes -= item[2]

    def clear(self) -> None:
        """Forget every entry (and bump the version: nothing worked out before holds)."""
        with self._lock:
            self._items.clear()
            self._bytes = 0
        self.version.bump()
