"""The load cache (`chaosllm.store.cache`): a store loaded through it is the store loaded
without it, exchange for exchange and error for error; a changed file is always read
again; a cache that cannot be trusted is ignored."""

from __future__ import annotations

import copy
import json
import os
import pickle
import shutil
import time
import zlib
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest

from chaosllm.model import Exchange
from chaosllm.providers.openai_chat import OpenAIChat
from chaosllm.store import cache as cache_module
from chaosllm.store.cache import NO_CACHE_ENV, CachedExchange, RecordingsCache, default_cache
from chaosllm.store.formats import recording_files, recording_paths
from chaosllm.store.recordings import RecordingStore, shipped_dir
from tests.helpers import chat_completion, write

P = OpenAIChat()
OLD = time.time() - 3600  # an hour ago: well before any load (see RACY_NS)


def body(i: int) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": f"question {i}"}]}


def recording(i: int, text: str = "hello") -> dict[str, Any]:
    return {
        "chaosllm": 1,
        "provider": "openai.chat",
        "request": {"method": "POST", "path": "/v1/chat/completions", "body": body(i)},
        "response": {
            "status": 200,
            "body": chat_completion(text),
            "headers": {"x-request-id": "r"},
        },
        "meta": {"description": f"recording {i}"},
    }


def age(root: Path) -> None:
    """Every file under `root` modified an hour ago (what a cache may trust)."""
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            os.utime(os.path.join(dirpath, name), (OLD, OLD))


def read_cache(path: Path) -> tuple[dict[str, Any], bytes]:
    """A cache file's line of JSON and the bodies after it (past its checksum line)."""
    check, _, rest = path.read_bytes().partition(b"\n")
    assert int(check, 16) == zlib.crc32(rest)
    head, _, bodies = rest.partition(b"\n")
    data: dict[str, Any] = json.loads(head)
    return data, bodies


def write_cache(path: Path, data: dict[str, Any], bodies: bytes) -> None:
    """Write a cache file by hand, as its owner only may (its checksum made anew)."""
    rest = json.dumps(data).encode("ascii") + b"\n" + bodies
    path.write_bytes(b"%08x\n" % zlib.crc32(rest) + rest)
    path.chmod(0o600)


def state(store: RecordingStore) -> tuple[Any, ...]:
    return (
        store.exchanges,
        [(type(e), e.path, e.problem) for e in store.errors],
        store.by_digest,
        store.by_scenario,
        store.by_alias,
        store.alias_keyings,
        store.sequence_scenarios,
        store.scenario_info,
    )


@pytest.fixture
def cache(tmp_path: Path) -> RecordingsCache:
    return RecordingsCache(tmp_path / "cache", min_files=1)


def mixed_recordings(tmp_path: Path) -> Path:
    """The shipped recordings (every format chaosllm reads), some of our own, and bad
    files."""
    root = tmp_path / "recordings"
    shutil.copytree(shipped_dir("recordings"), root / "shipped")
    for i in range(5):
        write(root / "mine" / f"{i:04d}.json", recording(i))
    (root / "bad").mkdir()
    (root / "bad" / "0001.json").write_text("{not json", encoding="utf-8")
    write(root / "bad" / "0002.json", {"chaosllm": 7, "request": {}})
    write(root / "bad" / "0003.json", {"nothing": "here"})
    age(root)
    return root


def test_a_cached_load_is_the_same_store_as_a_parsed_one(
    tmp_path: Path, cache: RecordingsCache
) -> None:
    root = mixed_recordings(tmp_path)
    parsed = RecordingStore.load([root], cache=False)
    assert parsed.errors and parsed.exchanges
    first = RecordingStore.load([root], cache=cache)
    files = list(cache.directory.iterdir())
    assert len(files) == 1
    second = RecordingStore.load([root], cache=cache)
    assert state(first) == state(parsed)
    assert state(second) == state(parsed)
    # What the second load found in the cache: every readable file, no bad one.
    snapshot = cache.read(str(root))
    assert len(snapshot.files) == len(recording_paths(root)) - 3
    assert not any("/bad/" in name for name in snapshot.files)
    assert files[0].stat().st_mode & 0o777 == 0o600


def test_the_cache_serves_what_it_holds_not_the_files(
    tmp_path: Path, cache: RecordingsCache
) -> None:
    """The second load really comes from the cache: an entry edited in the cache (for an
    unchanged file) is what loads."""
    root = tmp_path / "recordings"
    write(root / "s" / "0001.json", recording(1))
    age(root)
    RecordingStore.load([root], cache=cache)
    [path] = cache.directory.iterdir()
    data, bodies = read_cache(path)
    [entry] = data["files"].values()
    entry[1][0][2] = "s/renamed"  # the exchange's name
    write_cache(path, data, bodies)
    [exchange] = RecordingStore.load([root], cache=cache).exchanges
    assert exchange.name == "s/renamed"


def test_a_cached_exchange_is_decoded_when_first_read_and_is_then_a_plain_one(
    tmp_path: Path, cache: RecordingsCache
) -> None:
    root = tmp_path / "recordings"
    for i in range(3):
        write(root / "s" / f"{i:04d}.json", recording(i, text=f"answer {i}"))
    age(root)
    parsed = RecordingStore.load([root], cache=False).exchanges
    RecordingStore.load([root], cache=cache)
    first, second, third = RecordingStore.load([root], cache=cache).exchanges
    assert [type(e) for e in (first, second, third)] == [CachedExchange] * 3
    # What indexing reads is there without decoding anything.
    assert (first.name, first.digest, first.meta) == (
        parsed[0].name,
        parsed[0].digest,
        {"description": "recording 0"},
    )
    assert type(first) is CachedExchange
    assert first.response.body["choices"][0]["message"]["content"] == "answer 0"
    assert type(first) is Exchange and first == parsed[0]
    assert first.request == parsed[0].request and first.response == parsed[0].response
    assert type(second) is CachedExchange
    assert second == parsed[1] and parsed[1] == second  # equality decodes, either way round
    assert type(second) is Exchange
    renamed = replace(third, name="s/other")  # a copy of a pending one: a plain exchange
    assert type(renamed) is Exchange and type(third) is Exchange
    assert renamed == replace(parsed[2], name="s/other")
    for pending in RecordingStore.load([root], cache=cache).exchanges[:2]:
        assert type(pending) is CachedExchange
        copied = (
            copy.deepcopy(pending)
            if pending.name == "s/0000"
            else pickle.loads(pickle.dumps(pending))
        )
        assert type(copied) is Exchange and copied == parsed[int(pending.name[-1])]


def test_a_pending_exchange_sets_every_field_of_an_exchange() -> None:
    """`CachedExchange.pending` sets `Exchange`'s slots one by one: a field added to
    `Exchange` must be added there too."""
    assert tuple(f.name for f in fields(Exchange)) == cache_module._FIELDS
    assert Exchange.__slots__ == cache_module._FIELDS


def test_a_cache_whose_bodies_were_changed_is_ignored_and_rewritten(
    tmp_path: Path, cache: RecordingsCache
) -> None:
    """The bodies are decoded late, so they are checked early: the checksum line covers
    them, and a cache they do not match is not used at all."""
    root = tmp_path / "recordings"
    write(root / "s" / "0001.json", recording(1, text="hello"))
    age(root)
    parsed = RecordingStore.load([root], cache=False)
    RecordingStore.load([root], cache=cache)
    [path] = cache.directory.iterdir()
    raw = path.read_bytes()
    _, bodies = read_cache(path)
    path.write_bytes(raw.replace(b'"hello"', b'"jello"'))
    store = RecordingStore.load([root], cache=cache)
    assert state(store) == state(parsed)
    assert type(store.exchanges[0]) is Exchange  # parsed from its file again
    assert read_cache(path)[1] == bodies  # and the cache written again
    path.write_bytes(raw[:-1])  # cut short
    assert state(RecordingStore.load([root], cache=cache)) == state(parsed)


def test_a_changed_file_is_read_again_and_its_digest_recomputed(
    tmp_path: Path, cache: RecordingsCache
) -> None:
    root = tmp_path / "recordings"
    target = write(root / "s" / "0001.json", recording(1))
    write(root / "s" / "0002.json", recording(2))
    age(root)
    RecordingStore.load([root], cache=cache)
    # Same size, same modification time: only the change time and the content differ.
    text = target.read_text(encoding="utf-8").replace("question 1", "question 9")
    target.write_text(text, encoding="utf-8")
    os.utime(target, (OLD, OLD))
    store = RecordingStore.load([root], cache=cache)
    assert store.exchanges[0].digest == P.digest(body(9))
    assert store.exchanges[0].request.body == body(9)
    assert state(store) == state(RecordingStore.load([root], cache=False))


def test_a_file_replaced_removed_or_added_is_seen(tmp_path: Path, cache: RecordingsCache) -> None:
    root = tmp_path / "recordings"
    for i in range(3):
        write(root / "s" / f"{i:04d}.json", recording(i))
    age(root)
    RecordingStore.load([root], cache=cache)
    replacement = write(tmp_path / "new.json", recording(0, text="changed"))
    os.utime(replacement, (OLD, OLD))
    os.replace(replacement, root / "s" / "0000.json")  # renamed over: a new inode
    (root / "s" / "0001.json").unlink()
    write(root / "s" / "0003.json", recording(3))
    store = RecordingStore.load([root], cache=cache)
    assert [e.name for e in store.exchanges] == ["s/0000", "s/0002", "s/0003"]
    assert store.exchanges[0].response.body["choices"][0]["message"]["content"] == "changed"
    assert state(store) == state(RecordingStore.load([root], cache=False))


def test_a_file_modified_just_before_the_load_is_not_cached_yet(
    tmp_path: Path, cache: RecordingsCache
) -> None:
    root = tmp_path / "recordings"
    write(root / "s" / "0001.json", recording(1))
    write(root / "s" / "0002.json", recording(2))
    os.utime(root / "s" / "0001.json", (OLD, OLD))  # 0002 was just written
    RecordingStore.load([root], cache=cache)
    snapshot = cache.read(str(root))
    assert list(snapshot.files) == [str(root / "s" / "0001.json")]


@pytest.mark.parametrize(
    "spoil",
    [
        lambda p: p.write_bytes(p.read_bytes()[:50]),  # cut short
        lambda p: p.write_bytes(b"\xff\xfe garbage"),
        lambda p: p.write_text('{"chaosllm_cache": 2, "code": "other", "files": {}}\n'),
        lambda p: p.chmod(0o666),  # others could have written it
    ],
    ids=["truncated", "garbage", "other-code", "world-writable"],
)
def test_a_cache_that_cannot_be_trusted_is_ignored_and_rewritten(
    tmp_path: Path, cache: RecordingsCache, spoil: Any
) -> None:
    root = mixed_recordings(tmp_path)
    parsed = RecordingStore.load([root], cache=False)
    RecordingStore.load([root], cache=cache)
    [path] = cache.directory.iterdir()
    spoil(path)
    assert state(RecordingStore.load([root], cache=cache)) == state(parsed)
    assert path.stat().st_mode & 0o777 == 0o600  # written again
    assert len(cache.read(str(root)).files) > 0


def test_a_cache_entry_of_the_wrong_shape_is_not_trusted(
    tmp_path: Path, cache: RecordingsCache
) -> None:
    root = tmp_path / "recordings"
    write(root / "s" / "0001.json", recording(1))
    age(root)
    parsed = RecordingStore.load([root], cache=False)
    RecordingStore.load([root], cache=cache)
    [path] = cache.directory.iterdir()
    data, bodies = read_cache(path)
    [entry] = data["files"].values()
    good = entry[1][0]
    for bad in (
        good[:5],  # too few fields
        [*good[:-1], len(bodies) + 1],  # a body beyond the end
        [*good[:4], "meta", *good[5:]],  # a field of the wrong type
    ):
        entry[1][0] = bad
        write_cache(path, data, bodies)
        store = RecordingStore.load([root], cache=cache)
        assert state(store) == state(parsed)
        assert type(store.exchanges[0]) is Exchange


def test_small_directories_and_a_cache_inside_the_recordings_are_not_cached(
    tmp_path: Path,
) -> None:
    root = tmp_path / "recordings"
    for i in range(3):
        write(root / "s" / f"{i:04d}.json", recording(i))
    age(root)
    few = RecordingsCache(tmp_path / "cache", min_files=4)
    RecordingStore.load([root], cache=few)
    assert not (tmp_path / "cache").exists()
    inside = RecordingsCache(root / ".cache", min_files=1)
    store = RecordingStore.load([root], cache=inside)
    assert not (root / ".cache").exists()
    assert len(store.exchanges) == 3


def test_the_cache_keeps_a_bounded_number_of_files(tmp_path: Path) -> None:
    cache = RecordingsCache(tmp_path / "cache", min_files=1, max_files=2)
    for n in range(4):
        root = tmp_path / f"recordings-{n}"
        write(root / "s" / "0001.json", recording(n))
        age(root)
        RecordingStore.load([root], cache=cache)
    kept = list(cache.directory.iterdir())
    assert len(kept) == 2
    assert cache.file_for(str(tmp_path / "recordings-3")) in kept


def test_the_default_cache_lives_in_the_users_cache_directory_and_can_be_turned_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(cache_module.CACHE_DIR_ENV, raising=False)
    monkeypatch.delenv(NO_CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    found = default_cache()
    assert found is not None
    assert found.directory == tmp_path / "xdg" / "chaosllm" / "recordings"
    monkeypatch.setenv(cache_module.CACHE_DIR_ENV, str(tmp_path / "mine"))
    found = default_cache()
    assert found is not None and found.directory == tmp_path / "mine" / "recordings"
    monkeypatch.setenv(NO_CACHE_ENV, "1")
    assert default_cache() is None
    assert RecordingStore.load([tmp_path], cache=True).cache is None


def test_recording_paths_spell_the_paths_as_recording_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = mixed_recordings(tmp_path)
    monkeypatch.chdir(tmp_path)
    for spelt in (root, Path("recordings"), Path("./recordings/"), Path(".")):
        assert recording_paths(spelt) == [str(p) for p in recording_files(spelt)]
    monkeypatch.chdir(root / "mine")
    assert recording_paths(Path(".")) == [str(p) for p in recording_files(Path("."))]
    assert recording_paths(Path(".")) == [f"{i:04d}.json" for i in range(5)]


def _exact_cache(tmp_path: Path, cache: RecordingsCache) -> tuple[Path, Path, RecordingStore]:
    root = tmp_path / "recordings"
    for i in range(3):
        write(root / "s" / f"{i:04d}.json", recording(i, text=f"answer {i}"))
    age(root)
    parsed = RecordingStore.load([root], cache=False)
    RecordingStore.load([root], cache=cache)
    [path] = cache.directory.iterdir()
    return root, path, parsed


def test_a_cache_with_one_offset_digit_corrupted_is_ignored_whole(
    tmp_path: Path, cache: RecordingsCache
) -> None:
    """The checksum covers the heads too: one digit of a body's offset changed (a flipped
    bit on disk) makes the whole cache unused, not one recording answer 500."""
    root, path, parsed = _exact_cache(tmp_path, cache)
    raw = path.read_bytes()
    data, _ = read_cache(path)
    [entry] = [e for name, e in data["files"].items() if name.endswith("0001.json")]
    start, end = entry[1][0][-2:]
    spot = raw.index(b",%d,%d]" % (start, end))
    digit = spot + 1 + len(str(start)) - 1
    flipped = b"%d" % ((int(raw[digit : digit + 1]) + 1) % 10)
    path.write_bytes(raw[:digit] + flipped + raw[digit + 1 :])
    assert cache.read(str(root)).files == {}
    store = RecordingStore.load([root], cache=cache)
    assert state(store) == state(parsed)
    assert all(type(e) is Exchange for e in store.exchanges)  # none from the cache
    for exchange in store.exchanges:
        assert (
            exchange.response.body
            == parsed.exchanges[store.exchanges.index(exchange)].response.body
        )


def test_the_cache_is_written_through_a_fresh_file_never_a_planted_symlink(
    tmp_path: Path, cache: RecordingsCache
) -> None:
    root, path, _ = _exact_cache(tmp_path, cache)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    # Every name the old code could have used for its temporary file, planted.
    for pid in range(os.getpid() - 2, os.getpid() + 3):
        os.symlink(victim, path.with_name(f".{path.name}.{pid}.tmp"))
    path.unlink()
    RecordingStore.load([root], cache=cache)
    assert victim.read_text() == "precious"
    assert path.exists() and not path.is_symlink()
    assert path.stat().st_mode & 0o777 == 0o600


def test_the_cache_directory_is_owner_only_and_a_symlinked_one_is_not_written(
    tmp_path: Path,
) -> None:
    root = tmp_path / "recordings"
    write(root / "s" / "0001.json", recording(1))
    age(root)
    opened = tmp_path / "open"
    opened.mkdir(mode=0o777)
    opened.chmod(0o777)
    RecordingStore.load([root], cache=RecordingsCache(opened, min_files=1))
    assert opened.stat().st_mode & 0o777 == 0o700
    assert len(list(opened.iterdir())) == 1
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(elsewhere)
    RecordingStore.load([root], cache=RecordingsCache(link, min_files=1))
    assert list(elsewhere.iterdir()) == []
