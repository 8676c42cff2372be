"""What an import loads, checked in a fresh interpreter (as trio checks that importing it
loads no heavy module): the pytest plugin, loaded by every pytest run where chaosllm is
installed, and the pure engine import no server library; ``import chaosllm`` loads the
server only when `ChaosServer` is first used."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import pytest

import chaosllm.core

SERVER_LIBRARIES = ("starlette", "anyio", "h11", "httpx", "uvicorn", "httptools", "uvloop")

CORE_MODULES = ["chaosllm.core"] + [
    info.name for info in pkgutil.walk_packages(chaosllm.core.__path__, "chaosllm.core.")
]


def _run(code: str) -> dict[str, object]:
    """Run `code` in a fresh interpreter; the JSON it prints last."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def _loaded_after(module: str) -> list[str]:
    """The server libraries loaded by ``import <module>`` (top-level package names)."""
    result = _run(
        f"import json, sys\nimport {module}\n"
        f"print(json.dumps({{'loaded': sorted({{m.partition('.')[0] for m in sys.modules}}"
        f" & {set(SERVER_LIBRARIES)!r})}}))"
    )
    loaded = result["loaded"]
    assert isinstance(loaded, list)
    return [str(name) for name in loaded]


@pytest.mark.parametrize("module", ["chaosllm", "chaosllm.pytest_plugin", *CORE_MODULES])
def test_importing_loads_no_server_library(module: str) -> None:
    assert _loaded_after(module) == []


def test_the_check_sees_a_server_library_when_one_is_loaded() -> None:
    """The check itself works: the server does load them."""
    assert {"starlette", "anyio", "httptools"} <= set(_loaded_after("chaosllm.server"))


def test_a_replaying_server_loads_neither_the_fallback_wire_nor_the_proxy() -> None:
    """What start-up imports is what it needs: h11 (the fallback server's parser, and the
    proxy's client) and the recording proxy load when first asked for, not before."""
    result = _run(
        "import json, sys\n"
        "import chaosllm.cli\n"
        "before = sorted(m for m in ('h11', 'chaosllm.record.proxy', 'chaosllm.wire.h11_server')"
        " if m in sys.modules)\n"
        "from chaosllm.wire import H11WireServer\n"
        "from chaosllm.record.proxy import Upstream\n"
        "print(json.dumps({'before': before, 'after': 'h11' in sys.modules,\n"
        "    'same': H11WireServer is sys.modules['chaosllm.wire.h11_server'].H11WireServer}))"
    )
    assert result == {"before": [], "after": True, "same": True}


def test_chaos_server_is_imported_on_first_use() -> None:
    result = _run(
        "import json, sys\n"
        "import chaosllm\n"
        "before = 'chaosllm.server' in sys.modules\n"
        "listed = 'ChaosServer' in dir(chaosllm) and 'ChaosServer' in chaosllm.__all__\n"
        "from chaosllm import ChaosServer\n"
        "import chaosllm.server\n"
        "print(json.dumps({'before': before, 'listed': listed,\n"
        "    'same': ChaosServer is chaosllm.server.ChaosServer is chaosllm.ChaosServer}))"
    )
    assert result == {"before": False, "listed": True, "same": True}


def test_the_plugin_imports_the_server_inside_its_fixtures(pytester: pytest.Pytester) -> None:
    """A test run that uses no chaosllm fixture never imports the server."""
    pytester.makepyfile(
        """
        import sys

        def test_no_server():
            assert "chaosllm.pytest_plugin" in sys.modules  # the plugin is loaded
            assert "chaosllm.server" not in sys.modules
            assert "chaosllm.http.app" not in sys.modules
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=60)
    result.assert_outcomes(passed=1)
