"""Fresh ids: a real API mints new ids in every answer (``chatcmpl-``, ``call_``...), so a
recording served again to a session gets new ones, derived from a key, the same
everywhere in the answer (JSON body or frames); a request that echoes them is turned
back to the recorded ones before it is keyed. Pure; no cache: where the ids sit in a
plan is worked out on each call."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from chaosllm.model import JSON, Piece, ResponsePlan
from chaosllm.providers.text import keyed_strings

__all__ = ["REQUEST_ID_FORMS", "IdTemplate", "MintedIds", "request_id", "swap_strings"]

_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def _uuid(raw: bytes) -> str:
    """A version-4 UUID's spelling of 16 bytes (the version and variant bits set)."""
    b = bytearray(raw[:16])
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _base62(raw: bytes, size: int) -> str:
    number = int.from_bytes(raw, "big")
    out = []
    for _ in range(size):
        number, digit = divmod(number, 62)
        out.append(_BASE62[digit])
    return "".join(out)


REQUEST_ID_FORMS: dict[str, Callable[[bytes], str]] = {
    "openai": lambda raw: "req_" + raw[:16].hex(),
    "anthropic": lambda raw: "req_011C" + _base62(raw, 20),
    "uuid": _uuid,
}
"""How each API spells the id of a request (OpenAI's ``req_`` and 32 hex digits,
Anthropic's ``req_011C...``, Azure's and AWS's UUIDs), from random bytes."""


def request_id(key: str, form: str) -> str:
    """The id of a request in the API's `form` (`REQUEST_ID_FORMS`), derived from `key`
    (the server seed and the request's place in the journal: the same key, the same id)."""
    raw = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=32).digest()
    return REQUEST_ID_FORMS[form](raw)


class MintedIds:
    """The ids a protocol's API mints (those starting with one of `prefixes`): found in an
    answer, replaced by fresh ones in its plan, turned back in a request echoing them."""

    __slots__ = ("_pattern", "prefixes")

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        self.prefixes = prefixes
        alternatives = b"|".join(re.escape(p.encode("ascii")) for p in prefixes)
        self._pattern = (
            re.compile(b'"((?:' + alternatives + b')[A-Za-z0-9_-]+)"') if prefixes else None
        )

    def found(self, answer: JSON) -> list[str]:
        """The ids the API minted in an answer (values of its ``id`` and ``call_id`` keys
        that start with one of `prefixes`), in order of first appearance."""
        prefixes = self.prefixes
        found: dict[str, None] = {}
        for key, value in keyed_strings(answer):
            if key in _ID_KEYS and value.startswith(prefixes) and _ID.match(value):
                found.setdefault(value, None)
        return list(found)

    def fresh(
        self, plan: ResponsePlan, answer: JSON, key: str, template: IdTemplate | None = None
    ) -> tuple[tuple[Piece, ...], dict[str, str]]:
        """The pieces of `plan` (rendered from `answer`) with every id the API minted in
        `answer` replaced by a fresh one: the same prefix, length and alphabet, derived
        from `key` and the id (the same key gives the same ids), the same everywhere in
        the body or the frames; and the mapping of the recorded ids to the fresh ones
        (empty: nothing to replace, the pieces are the plan's). Where the ids sit in the
        plan is `template` (`template`: worked out here when not given)."""
        if template is None:
            template = self.template(plan, answer)
        if not template.ids:
            return plan.pieces, {}
        seed = key.encode("utf-8", "surrogatepass") + b"\x00"
        fresh = [spec.fresh(seed) for spec in template.ids]
        pieces = tuple(
            piece
            if len(segments) == 1
            else Piece(
                b"".join([fresh[s] if type(s) is int else s for s in segments]),  # type: ignore[misc]
                piece.delay_ms,
                piece.frame,
            )
            for piece, segments in zip(plan.pieces, template.pieces, strict=True)
        )
        return pieces, {
            spec.old: new.decode("ascii") for spec, new in zip(template.ids, fresh, strict=True)
        }

    def template(self, plan: ResponsePlan, answer: JSON) -> IdTemplate:
        """Where the ids the API minted in `answer` sit in `plan` (rendered from it): what
        `fresh` needs, the same for every plan equal to `plan` (a memo may keep it)."""
        ids = self.found(answer) if self.prefixes else []
        pieces: tuple[tuple[bytes | int, ...], ...] = ()
        if ids:
            index = {old.encode("ascii"): i for i, old in enumerate(ids)}
            alternatives = b"|".join(re.escape(old) for old in sorted(index, key=len, reverse=True))
            pattern = re.compile(b'(?<=")(' + alternatives + b')(?=")')
            pieces = tuple(
                tuple(
                    index[part] if i % 2 else part
                    for i, part in enumerate(pattern.split(piece.data))
                )
                for piece in plan.pieces
            )
        return IdTemplate(tuple(_IdSpec.of(old, self.prefixes) for old in ids), pieces)

    def recorded(self, raw: bytes, minted: Mapping[str, str]) -> bytes:
        """A request body with the fresh ids of `minted` (fresh -> recorded) that it
        echoes (a tool call's id, a ``previous_response_id``) turned back into the
        recorded ones, so that it keys like the recorded request."""
        pattern = self._pattern
        if pattern is None or pattern.search(raw) is None:
            return raw

        def replace(found: re.Match[bytes]) -> bytes:
            old = minted.get(found.group(1).decode("ascii"))
            return b'"' + old.encode("ascii") + b'"' if old is not None else found.group(0)

        return pattern.sub(replace, raw)


@dataclass(frozen=True, slots=True)
class IdTemplate:
    """Where the minted ids sit in a plan: each piece cut at them (an int is the index of
    an id in `ids`, bytes are kept as they are)."""

    ids: tuple[_IdSpec, ...]
    pieces: tuple[tuple[bytes | int, ...], ...]


@dataclass(frozen=True, slots=True)
class _IdSpec:
    """A recorded id, and how a fresh one for it is drawn: its prefix kept, its tail's
    characters drawn from a hash by `table` (its tail's alphabet: hex, lower case and
    digits, or letters and digits), any ``_`` or ``-`` of its tail kept in place."""

    old: str
    prefix: bytes
    tail: str
    table: bytes
    separators: frozenset[str]
    salt: bytes

    @classmethod
    def of(cls, old: str, prefixes: tuple[str, ...]) -> _IdSpec:
        prefix = max((p for p in prefixes if old.startswith(p)), key=len)
        tail = old[len(prefix) :]
        chars = set(tail)
        separators = frozenset(chars & {"_", "-"})
        chars -= separators
        table = next((_TABLES[a] for a in _ALPHABETS if chars <= a), _TABLES[_ALPHABETS[-1]])
        salt = old.encode("ascii") + b"\x00"
        return cls(old, prefix.encode("ascii"), tail, table, separators, salt)

    def fresh(self, seed: bytes) -> bytes:
        """The fresh id for a key (`seed`: the key's bytes and a NUL)."""
        size = len(self.tail)
        stream = hashlib.blake2b(seed + self.salt).digest()
        counter = 1
        while len(stream) < size:
            stream += hashlib.blake2b(seed + self.salt + b"%d" % counter).digest()
            counter += 1
        drawn = stream[:size].translate(self.table)
        if self.separators:
            drawn = bytes(
                ord(c) if c in self.separators else d for c, d in zip(self.tail, drawn, strict=True)
            )
        return self.prefix + drawn


_ID_KEYS = frozenset({"id", "call_id"})
_ID = re.compile(r"[A-Za-z]+[-_][A-Za-z0-9_-]+\Z")
_ALPHABETS = (
    frozenset("0123456789abcdef"),
    frozenset("abcdefghijklmnopqrstuvwxyz0123456789"),
    frozenset("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"),
)
_TABLES = {
    alphabet: bytes(sorted(alphabet)[i % len(alphabet)].encode("ascii")[0] for i in range(256))
    for alphabet in _ALPHABETS
}
"""Per alphabet, a byte -> character table (`bytes.translate` maps hash bytes with it)."""


def swap_strings(value: JSON, swap: Mapping[str, str]) -> JSON:
    """`value` with every string that is a key of `swap` replaced by its value (an answer
    with the fresh ids `MintedIds.fresh` gave its plan)."""
    if isinstance(value, str):
        return swap.get(value, value)
    if isinstance(value, dict):
        return {k: swap_strings(v, swap) for k, v in value.items()}
    if isinstance(value, list):
        return [swap_strings(v, swap) for v in value]
    return value
