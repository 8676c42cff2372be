"""Did you mean: the names closest to a mistyped one, for error messages.

Pure and tiny, in the base layer, so that every layer's messages (the CLI's, the control
plane's 400s, a profile or provider looked up by name) suggest alike.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

__all__ = ["close_names", "did_you_mean"]


def close_names(word: str, choices: Iterable[str], *, n: int = 3) -> list[str]:
    """The `n` names of `choices` closest to `word` (difflib's ratio, cutoff 0.6), best
    first; a name that `word` is a prefix of counts as close too."""
    names = list(dict.fromkeys(choices))
    found = difflib.get_close_matches(word, names, n=n, cutoff=0.6)
    if len(found) < n and len(word) >= 3:
        # a prefix, or a misspelt first word of a longer name ("flakey": flaky-provider)
        heads = {c: re.split(r"[-_.]", c.lstrip("-"), maxsplit=1)[0] for c in names}
        close_heads = set(difflib.get_close_matches(word.lstrip("-"), heads.values(), cutoff=0.8))
        found += [
            c for c in names if c not in found and (c.startswith(word) or heads[c] in close_heads)
        ][: n - len(found)]
    return found


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``" (did you mean 'http_503'?)"``, or ``""`` when nothing is close."""
    found = close_names(word, choices)
    if not found:
        return ""
    return " (did you mean " + " or ".join(repr(name) for name in found) + "?)"
