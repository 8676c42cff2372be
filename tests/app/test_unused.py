"""Unused recordings: `GET /__unused`, the journal summary, and `ChaosServer.unused()`, so
that a test can assert every fixture it ships was used."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from chaosllm import ChaosServer
from tests.helpers import recording


def test_unused_lists_what_was_never_served_since_the_last_reset(tmp_path: Path) -> None:
    for name in ("simple-chat/0001", "knowledge/0001", "knowledge/0002"):
        path = tmp_path / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(recording(name)), "utf-8")
    with ChaosServer(tmp_path) as server, httpx.Client(base_url=server.url, timeout=10) as client:
        assert server.unused() == ["knowledge/0001", "knowledge/0002", "simple-chat/0001"]
        body = recording("knowledge/0002")["request"]["body"]
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        listed = client.get("/__unused").json()
        assert [u["name"] for u in listed["unused"]] == ["knowledge/0001", "simple-chat/0001"]
        assert listed["total"] == 3 and listed["unused"][0]["source"].endswith("0001.json")
        summary = client.get("/__requests").json()["summary"]
        assert summary["unused"] == ["knowledge/0001", "simple-chat/0001"]
        assert summary["requests"] == 1 and summary["misses"] == 0
        assert (
            "2 of 3 recordings never served since the last reset: knowledge/0001, "
            "simple-chat/0001" in summary["text"]
        )
        # a request a fault destroyed did not use its recording
        server.arm("http_503")
        simple = recording("simple-chat/0001")["request"]["body"]
        assert client.post("/v1/chat/completions", json=simple).status_code == 503
        assert "simple-chat/0001" in server.unused()
        assert client.post("/v1/chat/completions", json=simple).status_code == 200
        assert server.unused() == ["knowledge/0001"]
        assert client.post("/__reset").status_code == 200
        assert len(client.get("/__unused").json()["unused"]) == 3
