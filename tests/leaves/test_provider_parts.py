"""A provider is its name, its routes and three parts (codec, errors, fault hooks), each
with defaults (`chaosllm.providers.base`). What `chaosllm.core` asks of a provider stays on
`Provider` as a one-line delegation to a part; the hooks only `chaosllm.faults` calls live
on the fault-hooks part, and `chaosllm.faults` calls them there."""

from __future__ import annotations

import re

import pytest

from chaosllm.providers import PROVIDERS
from chaosllm.providers.base import Codec, Errors, FaultHooks, Provider
from tests.helpers import ROOT

PACKAGE = ROOT / "chaosllm"

ROUTES = {"name", "paths", "path_templates", "client_header", "path_params", "bind"}
ROUTES |= {"model_protocol", "call_headers", "bind_headers"}
ROUTES |= {"methods", "methods_of", "bodiless"}
PARTS = {"parts", "codec", "errors", "faults"}
DELEGATED = {
    "codec": {
        "validate",
        "canonical",
        "digest",
        "wants_stream",
        "model_of",
        "render",
        "render_key",
        "served_answer",
        "estimated",
        "journal_fields",
        "fresh_ids",
        "id_template",
        "recorded_ids",
        "assemble",
        "fallback",
        "conversation_findings",
        "has_system_prompt",
    },
    "errors": {"error_body", "error_headers", "rate_limit_headers", "render_error"},
}


def public_names(cls: type) -> set[str]:
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass is object:
            continue
        names |= {n for n in vars(klass) if not n.startswith("_")}
        names |= {n for n in vars(klass).get("__annotations__", {}) if not n.startswith("_")}
    return names


def test_provider_is_its_routes_its_parts_and_what_core_asks() -> None:
    expected = ROUTES | PARTS | {"upstream_path"} | set().union(*DELEGATED.values())
    assert public_names(Provider) == expected


@pytest.mark.parametrize("provider", list(PROVIDERS.values()), ids=list(PROVIDERS))
def test_each_provider_composes_its_parts(provider: Provider) -> None:
    assert isinstance(provider.codec, Codec)
    assert isinstance(provider.errors, Errors)
    assert isinstance(provider.faults, FaultHooks)
    assert provider.errors.codec is provider.codec
    assert provider.faults.codec is provider.codec
    assert provider.faults.errors is provider.errors
    # a concrete provider writes its protocol in its parts, not on Provider
    written = set()
    for klass in type(provider).__mro__:
        if klass is Provider:
            break
        written |= {n for n in vars(klass) if not n.startswith("__")}
    assert written <= ROUTES | {"parts", "upstream_path"}, written


@pytest.mark.parametrize("provider", list(PROVIDERS.values()), ids=list(PROVIDERS))
def test_what_core_asks_is_delegated_to_a_part(provider: Provider) -> None:
    for part, names in DELEGATED.items():
        for name in names:
            method = getattr(provider, name)
            assert method.__self__ is getattr(provider, part), name
            assert method.__func__ is getattr(type(getattr(provider, part)), name)


def test_faults_call_the_fault_hooks_on_the_fault_hooks_part() -> None:
    hooks = public_names(FaultHooks) - {"codec", "errors"}
    wrong: list[str] = []
    for path in sorted((PACKAGE / "faults").glob("*.py")):
        for number, line in enumerate(path.read_text("utf-8").splitlines(), 1):
            for found in re.finditer(r"(\w+)\.(\w+)\(", line):
                if found.group(2) in hooks and found.group(1) != "faults":
                    wrong.append(f"{path.name}:{number}: {line.strip()}")
    assert wrong == []
