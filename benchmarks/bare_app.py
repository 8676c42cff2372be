"""The baseline: a bare Starlette app that answers with fixed bytes.

``POST /v1/chat/completions`` reads the request body (as any handler must) and
answers with the payload file's ``json`` bytes, or -- when the body asks for
``"stream": true`` -- a `StreamingResponse` yielding its ``sse_frames`` one by
one. No parsing, no matching, no journal: what is left is the cost of the
server and of Starlette itself, which chaosllm cannot go below.

Run as a server (the benchmark does this in a subprocess)::

    python benchmarks/bare_app.py --server builtin|h11|uvicorn [--no-uvloop] --payloads FILE

``builtin`` hosts the app on `chaosllm.wire.WireServer` (as ``chaosllm serve
--server builtin`` does: on uvloop when importable), ``h11`` on
`chaosllm.wire.H11WireServer` (the pure-Python fallback); ``uvicorn`` runs it
with the same configuration as ``chaosllm serve --server uvicorn`` (httptools,
uvloop when importable, no access log, lifespan off). It prints
``bare listening on http://127.0.0.1:PORT`` once bound. ``POST /__fault`` and
``DELETE /__fault/{id}`` answer like chaosllm's control plane without doing
anything: the floor of the arm + disarm round trip.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

__all__ = ["create_app", "main"]

JSON_TYPE = "application/json"
SSE_HEADERS = {"cache-control": "no-cache"}
SSE_TYPE = "text/event-stream; charset=utf-8"


def create_app(json_body: bytes, sse_frames: Sequence[bytes]) -> Starlette:
    frames = tuple(sse_frames)

    async def stream() -> AsyncIterator[bytes]:
        for frame in frames:
            yield frame

    async def chat(request: Request) -> Response:
        body = await request.body()
        if b'"stream":true' in body or b'"stream": true' in body:
            return StreamingResponse(stream(), media_type=SSE_TYPE, headers=SSE_HEADERS)
        return Response(json_body, media_type=JSON_TYPE)

    async def health(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type=JSON_TYPE)

    async def arm(request: Request) -> Response:
        # The floor of an arm + disarm round trip: parse the spec, answer a small JSON.
        json.loads(await request.body())
        return JSONResponse({"ids": ["flt_1"]}, status_code=201)

    async def disarm(request: Request) -> Response:
        return JSONResponse({"disarmed": 1})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/__fault", arm, methods=["POST"]),
            Route("/__fault/{id}", disarm, methods=["DELETE"]),
        ]
    )


def _announce(port: int) -> None:
    print(f"bare listening on http://127.0.0.1:{port}", flush=True)


def _serve_uvicorn(app: Starlette, uvloop: bool) -> None:
    import uvicorn

    if not uvloop:
        sys.modules["uvloop"] = None  # type: ignore[assignment]
    loop = "asyncio"
    if uvloop:
        with contextlib.suppress(ImportError):
            import uvloop as _uvloop  # noqa: F401

            loop = "uvloop"
    try:
        import httptools  # noqa: F401

        http = "httptools"
    except ImportError:
        http = "h11"
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted sockets only when the
    # listening socket's proto is IPPROTO_TCP (uvloop sets it whatever the proto).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    config = uvicorn.Config(
        app, loop=loop, http=http, log_level="warning", access_log=False, lifespan="off"
    )
    _announce(sock.getsockname()[1])
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()


def _serve_builtin(app: Starlette, *, h11: bool, uvloop: bool) -> None:
    import anyio

    from chaosllm.wire import H11WireServer, WireServer
    from chaosllm.wire.common import backend_options

    async def main() -> None:
        cls = H11WireServer if h11 else WireServer
        server = cls(app, host="127.0.0.1", port=0)
        async with anyio.create_task_group() as tg:
            _, port = await tg.start(server.serve)
            _announce(port)
            await anyio.sleep_forever()

    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(main, backend_options=backend_options() if uvloop else {})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="bare Starlette baseline server")
    parser.add_argument("--server", choices=("builtin", "h11", "uvicorn"), required=True)
    parser.add_argument("--no-uvloop", action="store_true", help="on plain asyncio")
    parser.add_argument(
        "--payloads",
        type=Path,
        required=True,
        help='JSON file {"json": str, "sse_frames": [str, ...]}',
    )
    args = parser.parse_args(argv)
    payloads = json.loads(args.payloads.read_text(encoding="utf-8"))
    app = create_app(
        payloads["json"].encode("utf-8"),
        [frame.encode("utf-8") for frame in payloads["sse_frames"]],
    )
    if args.server == "uvicorn":
        with contextlib.suppress(KeyboardInterrupt):
            _serve_uvicorn(app, uvloop=not args.no_uvloop)
    else:
        _serve_builtin(app, h11=args.server == "h11", uvloop=not args.no_uvloop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
