"""Public names a package loads on first use (PEP 562), so that importing the package does
not import what only those names need: ``chaosllm.ChaosServer`` (the server libraries),
``chaosllm.wire.H11WireServer`` (h11)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    namespace: MutableMapping[str, Any], names: Mapping[str, str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` (from its `namespace`, ``globals()``)
    for `names` (public name -> the module it comes from): each is imported when first
    asked for, then kept in the namespace, so later lookups skip ``__getattr__``."""

    def __getattr__(name: str) -> object:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *namespace.get("__all__", ())})

    return __getattr__, __dir__
