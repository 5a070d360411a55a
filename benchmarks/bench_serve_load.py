"""Load on `treegym index serve`: many trainers sharing one index at once.

Starts the real CLI server in a subprocess (or uses --url), then opens N client connections at
the same moment (a barrier), and each sends R ``POST /retrieve`` requests on its keep-alive
connection. Reports answers, connection resets and other failures, and the latency p50 / p90 /
p99 / max, first requests (which include the connect) apart from the rest. Exits 1 on any reset
or failure. Examples:

    python benchmarks/bench_serve_load.py                       # 200 clients x 5 requests, BM25
    python benchmarks/bench_serve_load.py --clients 400 --index flat --limit 2000
    python benchmarks/bench_serve_load.py --url http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

QUERIES = ["inventor of the telephone", "Ibsen play", "acne treatment", "capital of Norway", "Röntgen x-rays"]


@dataclass
class Tally:
    first: list[float] = field(default_factory=list)  # seconds, first request of a connection
    rest: list[float] = field(default_factory=list)
    resets: int = 0
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def start_server(index: str, limit: int | None, python: str = sys.executable) -> tuple[subprocess.Popen, str]:
    """``treegym index serve`` on a free loopback port, run by ``python``: the process and its URL."""
    cmd = [python, "-m", "treegym.cli", "index", "serve", "--type", index, "--port", "0", "--quiet"]
    if limit:
        cmd += ["--limit", str(limit)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "serving {...} on http://127.0.0.1:PORT (...)"
    if " on http://" not in line:
        proc.kill()
        sys.exit(f"the server did not start: {line!r}")
    return proc, line.split(" on ", 1)[1].split()[0]


def client(url: str, requests_each: int, topk: int, barrier: threading.Barrier, tally: Tally, i: int) -> None:
    parsed = urlparse(url)
    barrier.wait()
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=120)
    try:
        for r in range(requests_each):
            body = json.dumps({"queries": [QUERIES[(i + r) % len(QUERIES)]], "topk": topk}).encode()
            t0 = time.perf_counter()
            conn.request("POST", "/retrieve", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            data = response.read()
            took = time.perf_counter() - t0
            with tally.lock:
                if response.status != 200:
                    tally.failures.append(f"HTTP {response.status}: {data[:120]!r}")
                else:
                    (tally.rest if r else tally.first).append(took)
    except (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected) as exc:
        with tally.lock:
            tally.resets += 1
            tally.failures.append(f"{type(exc).__name__}: {exc}")
    except OSError as exc:
        with tally.lock:
            tally.failures.append(f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


def quantiles(xs: list[float]) -> str:
    if not xs:
        return "-"
    s = sorted(xs)

    def q(p: float) -> float:
        return s[min(len(s) - 1, int(p * len(s)))]

    return f"p50 {q(0.5) * 1000:7.1f} ms  p90 {q(0.9) * 1000:7.1f} ms  p99 {q(0.99) * 1000:7.1f} ms  max {s[-1] * 1000:7.1f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=200, help="concurrent connections (default 200)")
    parser.add_argument("--requests", type=int, default=5, help="requests per connection (default 5)")
    parser.add_argument("--topk", type=int, default=3)
    parser.add_argument("--index", default="bm25", help="index type of the started server (default bm25)")
    parser.add_argument("--limit", type=int, default=2000, help="documents indexed by the started server")
    parser.add_argument("--url", default=None, help="load a running server instead of starting one")
    args = parser.parse_args()

    proc, url = (None, args.url) if args.url else start_server(args.index, args.limit)
    try:
        tally = Tally()
        barrier = threading.Barrier(args.clients)
        threads = [threading.Thread(target=client, args=(url, args.requests, args.topk, barrier, tally, i))
                   for i in range(args.clients)]  # fmt: skip
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)
    answered = len(tally.first) + len(tally.rest)
    print(f"server {url}: {args.clients} concurrent clients x {args.requests} requests in {wall:.1f} s "
          f"(nproc {os.cpu_count()})")  # fmt: skip
    print(f"  answered {answered} of {args.clients * args.requests}, resets {tally.resets}, "
          f"other failures {len(tally.failures) - tally.resets}")  # fmt: skip
    print(f"  all requests   {quantiles(tally.first + tally.rest)}")
    print(f"  first (connect) {quantiles(tally.first)}")
    print(f"  keep-alive     {quantiles(tally.rest)}")
    for failure in tally.failures[:5]:
        print(f"  e.g. {failure}")
    return 1 if tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
