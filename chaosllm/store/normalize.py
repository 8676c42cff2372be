"""Normalise request text so that volatile details do not defeat matching.

Why
---
Two requests from the same client run rarely differ in what they *say*; they
differ in what the environment injected: tool-call ids, completion ids, UUIDs,
commit hashes, the current time, the temporary directory of the test run, the
port an ephemeral server happened to bind. "Nearest" matching (SPEC §4) must
see through those, so before comparing, `normalize_text` replaces each such
substring with a stable placeholder:

==============  ==========================================================
``<id>``        OpenAI/Anthropic style ids (``call_…``, ``chatcmpl-…``,
                ``toolu_…``, ``resp_…``, ``msg_…`` and friends), UUIDs,
                hex strings of 12+ characters with a digit, and long
                (16+) alphanumeric tokens that mix letters and digits
``<ts>``        ISO-8601 dates and datetimes (``2024-05-01``,
                ``2024-05-01T10:30:00.123Z``, ``20240501T103000Z``) and unix
                epochs in a plausible range (seconds 1e9 to 2e9, i.e. 2001 to 2033,
                optionally fractional, and the same as milli/micro/nanoseconds)
``<time>``      a time of day ``HH:MM:SS`` (optionally fractional)
``<path>``      absolute paths: POSIX ``/a/b`` with at least two segments
                (``/home/x/…``, ``/tmp/…``, ``/Users/…``, ``file:///…``) and
                Windows ``C:\\…`` / ``C:/…``
``<port>``      the port of ``localhost:1234``, ``127.0.0.1:8000``,
                ``[::1]:8080``, ``host.example:443``, ``http://name:8080``
                (the host itself is kept)
==============  ==========================================================

The text is case-folded and its whitespace collapsed (runs of whitespace
become one space; leading/trailing whitespace goes) before the rules apply;
nothing volatile spans a space (``2024-05-01 10:30:00`` is ``<ts> <time>``).
Placeholders are lower case and contain nothing any rule matches. A run whose
text changed is normalised again until it is stable (a placeholder can change
what its neighbours look like: ``localhost:8080.2024-05-01``), so the function
is idempotent: ``normalize_text(normalize_text(s)) == normalize_text(s)``.

URLs keep their path (``https://api.example/v1/chat`` is not a filesystem
path: a path must not follow a word character, ``.``, ``/``, ``~`` or ``\\``;
``server:/var/log`` does become ``server:<path>``). Relative paths
(``src/app.py``) and ``~/...`` are kept. ``name.ext:1234`` reads as a host and
port, so ``main.py:1234`` becomes ``main.py:<port>`` (a line number is not
worth keeping either). A bare ``word:1234`` counts as host and port only with
a 4-5 digit port.

Speed: case folding and collapsing are C string methods. Nothing volatile
spans a space, and only a run of non-space characters holding a digit, a
slash, a backslash, or a ``-``/``_`` followed by 16 letters can match a rule;
a character-class scan (`_TRIGGER`, a tight loop in `re`) finds those runs,
and only they go through the rules, one alternation compiled at import. Prose
costs ~10 µs per KB, plus ~1 µs per run with a digit or a slash.

`tokenize` splits text into word tokens: letters, digits and ``_`` (and ``<``
``>``, so that placeholders stay tokens) form words, everything else
separates; `str.translate` + `str.split`, several times faster than
``re.findall(r"\\w+")``. `normalize_tokens` is ``tokenize(normalize_text(text))``.
`tokenize_bytes` gives the same tokens UTF-8 encoded, faster still (bytes
methods); `chaosllm.store.nearest` indexes with it.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = [
    "PLACEHOLDERS",
    "normalize_text",
    "normalize_tokens",
    "tokenize",
    "tokenize_bytes",
]

PLACEHOLDERS: tuple[str, ...] = ("<id>", "<ts>", "<time>", "<path>", "<port>")
"""Every placeholder `normalize_text` may insert."""

_BARE = frozenset(PLACEHOLDERS)

# Prefixes of provider-issued ids. The tail must hold a digit (3+ chars) or be
# long (16+ chars), so that words like ``file-based`` or ``msg_handler`` stay.
_ID_PREFIXES = (
    "chatcmpl|cmpl|call|toolu|srvtoolu|resp|rs|fc|msg|run|thread|asst|file|batch|req|evt|step|ftjob"
)

_PATH_SEG = r"[\w.@%+~=,-]+"
_PORT_END = r"(?![\w:]|\.\d)"  # not "host:80.5", not "host:80:90"; "host:80." is fine

# One alternation, tried on each whitespace-free run that may hold something
# volatile (see `_TRIGGER`). Alternatives are grouped by how they start so that
# a position fails fast: a ``/``, a word boundary, or a ``[``. Earlier
# alternatives win at the same position. Each rule is a named group ``<kind>_<n>``.
_RULES = rf"""
  (?P<path_0>/(?:(?<=file:///)|(?<![\w./~\\<>-]/)){_PATH_SEG}(?:/{_PATH_SEG})+/?)
| \b(?:
    (?P<path_1>[a-z]:[\\/]+(?:[^\s\\/"'<>|:*?,;]+[\\/]*)*)
  | (?P<id_0>[0-9a-f]{{8}}-[0-9a-f]{{4}}-[0-9a-f]{{4}}-[0-9a-f]{{4}}-[0-9a-f]{{12}}\b)
  | (?P<id_1>(?:{_ID_PREFIXES})[-_](?:(?=[a-z0-9]*\d)[a-z0-9]{{3,}}|[a-z0-9]{{16,}})\b)
  | (?P<ts_0>\d{{4}}-[01]\d-[0-3]\d
        (?:t[0-2]\d:[0-5]\d(?::[0-5]\d(?:[.,]\d+)?)?(?:z|[+-][0-2]\d(?::?[0-5]\d)?)?)?
        (?![\w:]))
  | (?P<ts_1>\d{{8}}t\d{{6}}(?:[.,]\d+)?z?\b)
  | (?P<time_0>[0-2]?\d:[0-5]\d:[0-5]\d(?:[.,]\d+)?(?![\w:]))
  | (?P<ts_2>1\d{{9}}(?:\d{{3}}){{0,3}}(?:\.\d+)?\b)
  | (?=[a-z0-9]*\d)(?:
        (?P<id_2>[a-f0-9]{{12,}}\b)
      | (?P<id_3>(?=[a-z0-9]*[a-z])[a-z0-9]{{16,}}\b))
  | (?=[a-z0-9.-]*:\d)(?P<port_0>
        (?P<host>localhost|\d{{1,3}}(?:\.\d{{1,3}}){{3}}|[a-z0-9-]+(?:\.[a-z0-9-]+)+
          |(?<=//)[a-z0-9-]+):\d{{1,5}}{_PORT_END}
      | (?P<host_b>[a-z][a-z0-9-]*):\d{{4,5}}{_PORT_END})
  )
| (?P<port_1>(?P<host_6>\[[0-9a-f:.]*:[0-9a-f:.]*\]):\d{{1,5}}{_PORT_END})
"""

_VOLATILE = re.compile(_RULES, re.VERBOSE)

# A run (maximal substring without a space) can only hold something volatile if
# it has a digit, a slash or a backslash, or a ``-``/``_`` followed by 16
# letters (a prefixed id without digits). The pattern starts with a character
# class, which `re` scans for in a tight loop; the match extends to the end of
# the run.
_TRIGGER = re.compile(r"[0-9/\\_-](?:(?<=[-_])(?=[a-z]{16})|(?<![-_]))[^ ]*")


def _replace(match: re.Match[str]) -> str:
    kind = (match.lastgroup or "").partition("_")[0]
    if kind == "port":
        host = match.group("host") or match.group("host_b") or match.group("host_6")
        return f"{host}:<port>"
    return f"<{kind}>"


def normalize_text(text: str) -> str:
    """Case-fold `text`, collapse whitespace, replace volatile substrings by
    placeholders. See the module docstring for the rules."""
    s = " ".join(text.casefold().split())
    out: list[str] = []
    pos = 0
    rfind = s.rfind
    sub = _VOLATILE.sub
    for m in _TRIGGER.finditer(s):
        start = rfind(" ", pos, m.start()) + 1 or pos
        end = m.end()
        run = s[start:end]
        # Nothing shorter than 6 characters matches, except a path ("/a/b", "c:\\").
        if end - start >= 6 or "/" in run or "\\" in run:
            new = sub(_replace, run)
            # Until stable: a placeholder can change a neighbour's context.
            while new != run and new not in _BARE:
                run, new = new, sub(_replace, new)
            run = new
        out.append(s[pos:start])
        out.append(run)
        pos = end
    if not out:
        return s
    out.append(s[pos:])
    return "".join(out)


def _token_table() -> dict[int, str]:
    """Map every separator character to a space for `str.translate`.

    ASCII: everything but letters, digits, ``_``, ``<`` and ``>``. Beyond
    ASCII (Latin-1, General Punctuation, arrows, box drawing, CJK and
    full-width punctuation): punctuation, symbols, separators and controls,
    and every other character `str.split` splits on. Other characters (letters
    of any script, emoji, ...) are part of words.
    """
    table: dict[int, str] = {}
    for code in range(0x80):
        char = chr(code)
        if not (char.isalnum() or char in "_<>"):
            table[code] = " "
    blocks = (
        range(0x80, 0x100),
        range(0x2000, 0x2070),
        range(0x2190, 0x2200),
        range(0x2500, 0x2580),
        range(0x3000, 0x3040),
        range(0xFE30, 0xFE50),
        range(0xFF00, 0xFF66),
    )
    for block in blocks:
        for code in block:
            if unicodedata.category(chr(code))[0] in "PSZC":
                table[code] = " "
    table[0x1680] = " "  # OGHAM SPACE MARK, the one other str.isspace() character
    return table


_SEPARATORS = _token_table()
_BYTE_SEPARATORS = bytes(0x20 if code in _SEPARATORS else code for code in range(0x80)) + bytes(
    range(0x80, 0x100)
)


def tokenize(text: str) -> list[str]:
    """Word tokens of `text`, case-folded; no normalisation of volatile parts.

    Use it on text that is already normalised; `normalize_tokens` normalises
    first.
    """
    return text.casefold().translate(_SEPARATORS).split()


def tokenize_bytes(text: str) -> list[bytes]:
    """`tokenize`, with each token UTF-8 encoded (lone surrogates pass through).

    The same tokens, ~30 % faster on ASCII text (bytes methods have no
    character kinds to handle); what `chaosllm.store.nearest` indexes with.
    """
    folded = text.casefold()
    if not folded.isascii():
        folded = folded.translate(_SEPARATORS)
    return folded.encode("utf-8", "surrogatepass").translate(_BYTE_SEPARATORS).split()


def normalize_tokens(text: str) -> list[str]:
    """Word tokens of ``normalize_text(text)``."""
    return normalize_text(text).translate(_SEPARATORS).split()
