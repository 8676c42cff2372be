"""The control plane takes what people type: a body that parses as JSON counts as JSON
for the content-type rule when no browser header (``Origin``, ``Sec-Fetch-Site``) says a
web page sent it. curl's ``-d`` (a form content type) and Node's ``fetch`` with a string
body (``text/plain``) arm faults; a cross-origin browser-style POST still arms nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator

import httpx
import pytest

from chaosllm import ChaosServer

pytestmark = pytest.mark.timeout(60)

TIMEOUT = 20.0


@pytest.fixture(scope="module", params=["builtin", "uvicorn"])
def module_server(request: pytest.FixtureRequest) -> Iterator[ChaosServer]:
    with ChaosServer(server=request.param) as server:
        yield server


@pytest.fixture
def server(module_server: ChaosServer) -> ChaosServer:
    module_server.reset()
    return module_server


def armed_types(server: ChaosServer) -> list[str]:
    return [f["type"] for f in server.faults()["armed"]]


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_plain_curl_d_arms_a_fault(server: ChaosServer) -> None:
    result = subprocess.run(
        ["curl", "-sS", "-X", "POST", server.url + "/__fault", "-d", '{"type": "http_503"}'],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=True,
    )
    assert json.loads(result.stdout)["ids"], result.stdout
    assert armed_types(server) == ["http_503"]


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_curl_d_with_a_form_body_is_refused_and_says_why(server: ChaosServer) -> None:
    result = subprocess.run(
        ["curl", "-sS", "-X", "POST", server.url + "/__fault", "-d", "type=http_503"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=True,
    )
    error = json.loads(result.stdout)["error"]
    assert error["code"] == "control_forbidden"
    assert "not valid JSON" in error["message"]
    assert armed_types(server) == []


NODE_FETCH = """
const [url] = process.argv.slice(1);
fetch(url + "/__fault", {method: "POST", body: JSON.stringify({type: "http_429"})})
  .then(async (r) => { console.log(r.status); console.log(await r.text()); })
  .catch((e) => { console.error(e); process.exit(1); });
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node")
def test_node_fetch_with_a_string_body_arms_a_fault(server: ChaosServer) -> None:
    """undici's fetch sends ``text/plain;charset=UTF-8`` and ``Sec-Fetch-Mode: cors``,
    never ``Origin`` or ``Sec-Fetch-Site``."""
    result = subprocess.run(
        ["node", "-e", NODE_FETCH, server.url],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=True,
    )
    status, body = result.stdout.split("\n", 1)
    assert status == "201", body
    assert armed_types(server) == ["http_429"]


def test_a_cross_origin_browser_post_of_json_text_is_still_refused(server: ChaosServer) -> None:
    """What a page's ``fetch(url, {method: "POST", mode: "no-cors", body})`` sends."""
    answer = httpx.post(
        server.url + "/__fault",
        content=b'{"type": "http_503"}',
        headers={
            "Content-Type": "text/plain;charset=UTF-8",
            "Origin": "http://evil.example",
            "Sec-Fetch-Site": "cross-site",
            "Sec-Fetch-Mode": "no-cors",
        },
        timeout=TIMEOUT,
    )
    assert answer.status_code == 403
    assert answer.json()["error"]["code"] == "control_forbidden"
    assert armed_types(server) == []


def test_a_browser_header_without_origin_keeps_the_content_type_rule(
    server: ChaosServer,
) -> None:
    """A browser (or extension) that strips Origin still sends Sec-Fetch-Site."""
    answer = httpx.post(
        server.url + "/__fault",
        content=b'{"type": "http_503"}',
        headers={"Content-Type": "text/plain", "Sec-Fetch-Site": "same-origin"},
        timeout=TIMEOUT,
    )
    assert answer.status_code == 403
    assert "Content-Type: application/json" in answer.json()["error"]["message"]
    assert armed_types(server) == []
