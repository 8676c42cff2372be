"""The figures of issue #23, measured on a `chaosllm serve` subprocess over loopback:

- bomb: a gzip bomb (256 MiB of zeros, ~250 KB on the wire) answered by the upstream in
  record mode: the server's peak RSS (VmHWM), the time to answer, the worst wait of a
  control-plane request made meanwhile, and the recording's size on disk;
- pipeline: N clients that pipeline requests and never read an answer: the server's RSS
  growth per client, and whether a fresh client is still answered;
- flood: C keep-alive connections sending requests as fast as they are answered (a
  Python asyncio client, or ``--flooder wrk``, which loads the server harder for the
  same CPU): the worst wait of a fresh client (connect + one request) probed every
  100 ms from the flood's start (its connect storm included), in a process of its own;
  and the server's share of a core meanwhile (the machine's load average is printed
  too: on shared cores the figures move with it).

    python benchmarks/security.py bomb|pipeline|flood [--server h11] [--tree DIR]

``--tree DIR`` runs the server from another source tree (a checkout of an older commit)
for a before/after figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_SHIPPED = Path(__file__).resolve().parents[1] / "recordings" / "simple-chat" / "0001.json"
BODY = json.dumps(json.loads(_SHIPPED.read_text())["request"]["body"]).encode()
"""A request a shipped recording answers (a replay, not a miss)."""
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json"
    b"\r\nauthorization: Bearer sk-test\r\ncontent-length: %d\r\n\r\n%s" % (len(BODY), BODY)
)


def _rss(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


@contextmanager
def serving(args: list[str], tree: str | None) -> Iterator[tuple[int, subprocess.Popen[str]]]:
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = tree
    proc = subprocess.Popen(
        [sys.executable, "-m", "chaosllm", "serve", "--port", "0", "-q", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=tree or str(Path(__file__).resolve().parents[1]),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        port = int(line.rsplit(":", 1)[-1].strip().rstrip("/"))
        yield port, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _probe(port: int, path: bytes = b"/__fault", timeout: float = 60) -> float:
    """Seconds for a fresh connection to get one answer (`timeout` if it gets none)."""
    start = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(b"GET %s HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n" % path)
            sock.recv(65536)
    except TimeoutError:
        return timeout
    return time.monotonic() - start


def bomb(tree: str | None, server: str) -> dict[str, object]:
    squeeze = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    blob = b"".join(squeeze.compress(bytes(1 << 20)) for _ in range(256)) + squeeze.flush()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", "0")))
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-encoding", "gzip")
            self.send_header("content-length", str(len(blob)))
            self.end_headers()
            self.wfile.write(blob)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    upstream = f"http://127.0.0.1:{httpd.server_address[1]}"
    with tempfile.TemporaryDirectory() as record_dir:
        args = ["--mode", "record", "--upstream", upstream, "--record-dir", record_dir]
        with serving([*args, "--server", server], tree) as (port, proc):
            base = _rss(proc.pid)
            worst = 0.0
            stop = threading.Event()

            def prober() -> None:
                nonlocal worst
                while not stop.is_set():
                    worst = max(worst, _probe(port))
                    stop.wait(0.05)

            thread = threading.Thread(target=prober)
            thread.start()
            start = time.monotonic()
            with socket.create_connection(("127.0.0.1", port), timeout=300) as sock:
                sock.sendall(REQUEST.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n", 1))
                answer = bytearray()
                while chunk := sock.recv(1 << 20):
                    answer += chunk
                head = answer.split(b"\r\n", 1)[0].decode()
            took = time.monotonic() - start
            stop.set()
            thread.join()
            peak = _rss(proc.pid, "VmHWM")
        written = sum(p.stat().st_size for p in Path(record_dir).rglob("*") if p.is_file())
    httpd.shutdown()
    return {
        "compressed_bytes": len(blob),
        "answer": head,
        "seconds": round(took, 2),
        "peak_rss_mb": round(peak / 2**20, 1),
        "base_rss_mb": round(base / 2**20, 1),
        "control_plane_worst_wait_s": round(worst, 3),
        "recorded_bytes": written,
    }


def pipeline(tree: str | None, server: str, clients: int, seconds: float) -> dict[str, object]:
    with serving(["--server", server], tree) as (port, proc):
        _probe(port, b"/v1/models")
        base = _rss(proc.pid)
        socks = []
        for _ in range(clients):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            socks.append(sock)
        burst = REQUEST * 64
        deadline = time.monotonic() + seconds
        sent = 0
        while time.monotonic() < deadline:
            progressed = False
            for sock in socks:
                try:
                    sent += sock.send(burst)
                    progressed = True
                except BlockingIOError:
                    pass
            if not progressed:
                time.sleep(0.05)
        during = _probe(port, b"/v1/models", timeout=10)
        time.sleep(1.0)
        grown = _rss(proc.pid) - base
        peak = _rss(proc.pid, "VmHWM") - base
        fresh = _probe(port, b"/v1/models", timeout=10)
        for sock in socks:
            sock.close()
    return {
        "clients": clients,
        "bytes_sent_mb": round(sent / 2**20, 1),
        "rss_growth_mb": round(grown / 2**20, 1),
        "peak_growth_mb": round(peak / 2**20, 1),
        "per_client_mb": round(grown / clients / 2**20, 2),
        "fresh_client_s": round(fresh, 3),
        "fresh_client_during_s": round(during, 3),
    }


async def _flood(port: int, connections: int, seconds: float) -> int:
    done = 0
    stop = time.monotonic() + seconds
    req = b"GET /v1/models HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"

    async def one() -> None:
        nonlocal done
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return
        try:
            while time.monotonic() < stop:
                writer.write(req)
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                done += 1
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    await asyncio.gather(*(one() for _ in range(connections)))
    return done


_PROBER = (
    "import sys, time; sys.path.insert(0, sys.argv[1]); import security as s\n"
    "stop = time.monotonic() + float(sys.argv[3]); waits = []\n"
    "while time.monotonic() < stop:\n"
    "    waits.append(s._probe(int(sys.argv[2]), b'/v1/models')); time.sleep(0.1)\n"
    "waits.sort(); print(waits[-1], waits[len(waits) // 2], len(waits))\n"
)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def flood(
    tree: str | None, server: str, connections: int, seconds: float, flooder: str
) -> dict[str, object]:
    with serving(["--server", server, "--max-connections", str(connections + 64)], tree) as (
        port,
        proc,
    ):
        _probe(port, b"/v1/models")
        here = str(Path(__file__).resolve().parent)
        cpu = _cpu_s(proc.pid)
        started = time.monotonic()
        if flooder == "wrk":
            url = f"http://127.0.0.1:{port}/v1/models"
            load = subprocess.Popen(
                ["wrk", "-t1", f"-c{connections}", f"-d{round(seconds)}s", "--timeout", "30s", url],
                stdout=subprocess.PIPE,
                text=True,
            )
        prober = subprocess.Popen(
            [sys.executable, "-c", _PROBER, here, str(port), str(seconds - 0.5)],
            stdout=subprocess.PIPE,
            text=True,
        )
        if flooder == "wrk":
            out = load.communicate()[0]
            done = sum(int(line.split()[0]) for line in out.splitlines() if "requests in" in line)
        else:
            done = asyncio.run(_flood(port, connections, seconds))
        worst, median, probes = prober.communicate()[0].split()
        share = (_cpu_s(proc.pid) - cpu) / (time.monotonic() - started)
    return {
        "connections": connections,
        "flooder": flooder,
        "requests_per_s": round(done / seconds),
        "fresh_client_worst_wait_s": round(float(worst), 3),
        "fresh_client_median_wait_s": round(float(median), 3),
        "probes": int(probes),
        "server_cpu_share": round(share, 2),
        "load_average": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["bomb", "pipeline", "flood"])
    parser.add_argument("--server", default="builtin")
    parser.add_argument("--tree", help="run the server from this source tree")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--flooder", choices=["python", "wrk"], default="python")
    args = parser.parse_args()
    if args.what == "bomb":
        result = bomb(args.tree, args.server)
    elif args.what == "pipeline":
        result = pipeline(args.tree, args.server, args.clients, args.seconds)
    else:
        result = flood(args.tree, args.server, args.connections, args.seconds, args.flooder)
    print(json.dumps({"what": args.what, "server": args.server, **result}))


if __name__ == "__main__":
    main()
