"""The fixture-format registry: every format described once, as data, and everything about
formats (detection, parsing, alias digests, ``chaosllm import`` choices, doctor) derived
from it; the store's modules import one another without a cycle."""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped, unused-ignore]

import chaosllm
import chaosllm.store.formats as formats_pkg
from chaosllm.cli import main
from chaosllm.doctor import diagnose
from chaosllm.errors import RecordingError, UnknownFormat
from chaosllm.model import Keying
from chaosllm.store.formats import (
    ALIAS_DIGESTS,
    FORMATS,
    IMPORTABLE,
    NATIVE,
    RECORDING_SUFFIXES,
    UNKNOWN,
    UNKNOWN_HINT,
    FixtureFormat,
    detect,
    format_of,
    hashkeyed,
    load_tree,
    read_data,
    read_file,
)
from chaosllm.store.recordings import RecordingStore, shipped_dir
from tests.helpers import chat_completion

PACKAGE = Path(chaosllm.__file__).parent
FORMATS_DIR = Path(formats_pkg.__file__).parent

ASK = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
ANSWER = chat_completion(
    "hello",
    model="gpt-4o-mini",
    usage={"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
)
CASSETTE = {
    "version": 1,
    "interactions": [
        {
            "request": {
                "method": "POST",
                "uri": "https://api.openai.com/v1/chat/completions",
                "body": json.dumps(ASK),
                "headers": {"Content-Type": ["application/json"]},
            },
            "response": {
                "status": {"code": 200, "message": "OK"},
                "headers": {"Content-Type": ["application/json"]},
                "body": {"string": json.dumps(ANSWER)},
            },
        }
    ],
}
TRACE = {
    "model_name": "spot-echo",
    "turns": [
        {
            "user_input": "hi",
            "steps": [
                {"response": {"type": "text", "content": "hello"}},
                {"response": {"type": "text", "content": "again"}},
            ],
        }
    ],
}

NATIVE_RECORDING = json.loads(
    (shipped_dir("recordings") / "simple-chat" / "0001.json").read_text("utf-8")
)

SESSION_RECORDING = json.loads(
    (shipped_dir("recordings") / "realtime-text" / "0001.json").read_text("utf-8")
)

SAMPLES: dict[str, tuple[str, Any, int]] = {
    # format: (file under the recordings directory, its content, exchanges it holds)
    "chaosllm": ("simple-chat/0001.json", NATIVE_RECORDING, 1),
    "hash-keyed": (
        f"docs/{hashkeyed.request_digest(ASK)}.json",
        {"response": {"content": "hi"}},
        1,
    ),
    "trace": ("advanced/echo.json", TRACE, 2),
    "vcr": ("cassettes/chat.yaml", CASSETTE, 1),
    # a WebSocket session: no HTTP exchange (the session store loads it)
    "session": ("realtime-text/0001.json", SESSION_RECORDING, 0),
}


def write(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix in (".yaml", ".yml"):
        path.write_text(yaml.safe_dump(data), "utf-8")
    else:
        path.write_text(data if isinstance(data, str) else json.dumps(data), "utf-8")
    return path


def test_every_format_has_a_sample_here() -> None:
    assert set(SAMPLES) == set(FORMATS)


def test_every_entry_is_described_once_by_its_own_name() -> None:
    for name, entry in FORMATS.items():
        assert isinstance(entry, FixtureFormat) and entry.name == name
        assert callable(entry.detect) and callable(entry.parse)
        assert entry.keying in Keying.ALL and entry.shape and entry.suffixes
        assert all(s.startswith(".") for s in entry.suffixes)
    assert NATIVE in FORMATS and UNKNOWN not in FORMATS
    with pytest.raises(TypeError):
        FORMATS["x"] = FORMATS[NATIVE]  # type: ignore[index]


def test_every_format_module_is_registered() -> None:
    """Adding a format is one module with a ``FORMAT`` entry, and one line in `FORMATS`:
    a module whose entry is not registered is caught here."""
    entries = []
    for info in pkgutil.iter_modules([str(FORMATS_DIR)]):
        module = importlib.import_module(f"chaosllm.store.formats.{info.name}")
        if isinstance(getattr(module, "FORMAT", None), FixtureFormat):
            entries.append(module.FORMAT)
    assert sorted(e.name for e in entries) == sorted(FORMATS)
    assert all(FORMATS[e.name] is e for e in entries)


def test_importable_is_the_registrys_importable_names() -> None:
    assert set(IMPORTABLE) == {name for name, e in FORMATS.items() if e.importable}
    assert list(IMPORTABLE) == sorted(IMPORTABLE) == ["hash-keyed", "trace", "vcr"]
    assert not FORMATS[NATIVE].importable


def test_import_choices_come_from_the_registry(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["import", "--help"])
    assert exited.value.code == 0
    assert "one of: " + ", ".join(IMPORTABLE) in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit) as exited:
        main(["import", NATIVE, "a", "b"])
    assert exited.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_alias_digests_are_the_entries_own() -> None:
    assert dict(ALIAS_DIGESTS) == {
        e.keying: e.alias_digest for e in FORMATS.values() if e.alias_digest is not None
    }
    assert ALIAS_DIGESTS[Keying.HASH_KEYED] is hashkeyed.request_digest
    for entry in FORMATS.values():
        own = entry.keying not in (Keying.REQUEST, Keying.SEQUENCE)
        assert own == (entry.alias_digest is not None), entry.name


def test_recording_suffixes_are_every_entrys() -> None:
    assert set(RECORDING_SUFFIXES) == {s for e in FORMATS.values() for s in e.suffixes}
    assert RECORDING_SUFFIXES == (".json", ".yaml", ".yml")


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_each_format_is_detected_and_parsed(tmp_path: Path, name: str) -> None:
    rel, content, count = SAMPLES[name]
    path = write(tmp_path / rel, content)
    entry = FORMATS[name]
    data = read_data(path)
    assert detect(path, data) == name and format_of(path, data) is entry
    assert entry.detect(path, data)

    exchanges = read_file(path, root=tmp_path)
    assert len(exchanges) == count
    if not count:  # a session recording: for the session store, none for this one
        assert read_file(path, root=tmp_path, fmt=name) == []
        return
    assert {e.keyed_by for e in exchanges} == {entry.keying}
    assert {e.meta.get("format", NATIVE) for e in exchanges} == {name}
    assert {e.source for e in exchanges} == {str(path)}
    if entry.holds_run:  # a scenario of its own, named by its path
        scenario = Path(rel).with_suffix("").as_posix()
        assert [e.name for e in exchanges] == [f"{scenario}/{i:04d}" for i in range(1, count + 1)]
    else:  # one answer, in its directory's scenario
        scenario = Path(rel).parent.as_posix()
        assert [e.name for e in exchanges] == [f"{scenario}/{Path(rel).stem}"]
    assert {e.scenario for e in exchanges} == {scenario}
    # forcing the format it is in changes nothing; forcing another is refused
    assert read_file(path, root=tmp_path, fmt=name) == exchanges
    other = next(n for n in FORMATS if n != name)
    with pytest.raises(RecordingError, match=f"not a {other} file .it looks like a {name} file"):
        read_file(path, root=tmp_path, fmt=other)


def test_a_directory_of_every_format_loads_into_one_store(tmp_path: Path) -> None:
    for rel, content, _ in SAMPLES.values():
        write(tmp_path / rel, content)
    store = RecordingStore.load([tmp_path])
    assert store.errors == []
    assert len(store.exchanges) == sum(count for _, _, count in SAMPLES.values())
    # the formats that hold exchanges (a session recording holds none)
    assert {s["format"] for s in store.summary()} == {n for n, (_, _, k) in SAMPLES.items() if k}
    assert store.sequence_scenarios == {"advanced/echo": "spot-echo"}
    assert store.alias_keyings == {"openai.chat": frozenset({Keying.HASH_KEYED})}


def test_an_unknown_file_is_reported_with_its_path(tmp_path: Path) -> None:
    config = write(tmp_path / "s" / "config.json", {"retries": 3})
    notes = write(tmp_path / "s" / "notes.txt", "not a fixture")
    with pytest.raises(UnknownFormat) as caught:
        read_file(config, root=tmp_path)
    assert caught.value.path == str(config) and caught.value.problem == UNKNOWN_HINT
    assert str(caught.value).startswith(f"{config}: unknown format: ")
    assert all(e.shape in UNKNOWN_HINT for e in FORMATS.values())
    with pytest.raises(UnknownFormat, match="not a vcr file: unknown format"):
        read_file(config, root=tmp_path, fmt="vcr")
    _, errors = load_tree(notes)
    assert [(type(e), e.path) for e in errors] == [(UnknownFormat, str(notes))]
    store = RecordingStore.load([tmp_path])
    assert store.error_summary() == [{"path": str(config), "problem": UNKNOWN_HINT}]
    found = [p for p in diagnose([tmp_path]).problems if p.check == "unknown_format"]
    assert [(p.path, p.message) for p in found] == [(str(config), UNKNOWN_HINT)]


def test_detection_is_first_match_in_registry_order() -> None:
    names = list(FORMATS)
    both: dict[str, Any] = {"interactions": [], "turns": []}  # a cassette and a trace at once
    assert FORMATS["vcr"].detect(Path("x.json"), both)
    assert FORMATS["trace"].detect(Path("x.json"), both)
    assert detect(Path("x.json"), both) == "vcr" and names.index("vcr") < names.index("trace")
    native = {"request": {"body": {}}, "response": {"content": "hi"}}
    assert detect(Path("x.json"), native) == NATIVE
    # a session recording has "chaosllm": 1 too: its entry is asked first
    assert names[:2] == ["session", NATIVE]
    assert detect(Path("x.json"), SESSION_RECORDING) == "session"
    # JSON that is not an object is a (bad) native recording, so its error says why
    assert detect(Path("x.json"), [1, 2]) == NATIVE
    assert detect(Path("x.yaml"), [1, 2]) == UNKNOWN


def _string_comparisons(path: Path) -> list[str]:
    """Comparisons of anything with a format's name spelled out (``found == "vcr"``)."""
    names = set(FORMATS)
    found = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                if isinstance(side, ast.Constant) and side.value in names:
                    found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_dispatch_on_format_names() -> None:
    files = [
        FORMATS_DIR / "__init__.py",
        FORMATS_DIR / "importer.py",
        PACKAGE / "store" / "recordings.py",
        PACKAGE / "doctor.py",
    ]
    assert [hit for f in files for hit in _string_comparisons(f)] == []


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_the_formats_import_nothing_above_them() -> None:
    for path in sorted(FORMATS_DIR.glob("*.py")):
        imported = _imports(path)
        assert "chaosllm.store.recordings" not in imported, path.name
        if path.name != "importer.py":  # the importer writes: it may use the writer
            assert "chaosllm.store.writer" not in imported, path.name
    # what a format is builds on plain data only
    base = {m for m in _imports(FORMATS_DIR / "base.py") if m.startswith("chaosllm")}
    assert {m.split(".")[1] for m in base} == {"model"}


@pytest.mark.parametrize(
    "order",
    [
        ("chaosllm.store.formats", "chaosllm.store.recordings"),
        ("chaosllm.store.recordings", "chaosllm.store.formats"),
        ("chaosllm.store.formats.native", "chaosllm.store.matching"),
    ],
)
@pytest.mark.timeout(60)
def test_no_import_cycle(order: tuple[str, str]) -> None:
    # A fresh interpreter with a bare `chaosllm` package (its __init__ imports the whole
    # server, which would decide the import order for us).
    code = (
        "import sys, types\n"
        "pkg = types.ModuleType('chaosllm')\n"
        f"pkg.__path__ = [{str(PACKAGE)!r}]\n"
        "sys.modules['chaosllm'] = pkg\n"
        + "".join(f"import {module}\n" for module in order)
        + "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=50, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
