"""One request/response cycle of the ASGI app on the builtin server: the app's
``http.response.*`` messages framed as h11 frames them (`chaosllm.wire.head`), and its
``chaosllm.plan`` message compiled and run by the awaiting executor."""

from __future__ import annotations

from typing import TYPE_CHECKING

from chaosllm.core.report import Outcome, PlanReport
from chaosllm.model import ResponsePlan
from chaosllm.wire.common import Cycle
from chaosllm.wire.head import CHUNKED, LENGTH, build_head

if TYPE_CHECKING:
    from chaosllm.wire.protocol import Connection
    from chaosllm.wire.request import Request

__all__ = ["AppCycle"]


class AppCycle(Cycle):
    """One request/response cycle of the ASGI app on the builtin server (`Cycle`)."""

    __slots__ = ("conn", "keep", "mode", "remaining", "req")

    def __init__(self, conn: Connection, req: Request) -> None:
        super().__init__()
        self.conn = conn
        self.req = req
        self.keep = False
        self.mode = LENGTH
        self.remaining = 0

    def request_body(self) -> bytes:
        return self.req.body

    async def wait_gone(self) -> None:
        await self.conn.wait_gone()

    async def stream_head(self) -> None:
        conn = self.conn
        if conn.gone or conn.closed:
            return
        conn.write_quietly(self._head())
        if conn.flow.write_paused:
            await conn.flow.drain()

    def _head(self) -> bytes:
        conn = self.conn
        req = self.req
        try:
            head = build_head(
                self.status,
                self.headers,
                is_head=req.is_head,
                http10=req.http_version != "1.1",
                keep_alive=req.keep_alive,
                close=conn.server.shutting_down or conn.must_close,
            )
        except BaseException:
            conn.must_close = True
            raise
        self.mode, self.remaining, self.keep = head.mode, head.length, head.keep_alive
        return head.render()

    async def body_part(self, body: bytes, more: bool) -> None:
        conn = self.conn
        if conn.gone or conn.closed:
            return
        out: list[bytes] = []
        if not self.head_sent:
            self.head_sent = True
            out.append(self._head())
        mode = self.mode
        if body and not self.req.is_head:
            if mode == CHUNKED:
                out += (b"%x\r\n" % len(body), body, b"\r\n")
            elif mode == LENGTH:
                if len(body) > self.remaining:
                    conn.must_close = True
                    raise RuntimeError("Too much data for declared Content-Length")
                self.remaining -= len(body)
                out.append(body)
            else:
                out.append(body)
        if not more:
            if mode == CHUNKED and not self.req.is_head:
                out.append(b"0\r\n\r\n")
            elif mode == LENGTH and self.remaining != 0:
                conn.must_close = True
                raise RuntimeError("Too little data for declared Content-Length")
        if out:
            conn.write_quietly(out[0] if len(out) == 1 else b"".join(out))
            if conn.flow.write_paused:
                await conn.flow.drain()

    async def run_plan(self, plan: ResponsePlan, report: PlanReport) -> None:
        conn = self.conn
        try:
            program = conn.program(self.req, plan)
        except BaseException:
            report.outcome = Outcome.ERROR
            raise
        self.keep = await conn.execute(program, report)
