"""Memory of `treegym index serve` after a burst of heavy requests: is it given back?

Starts the real CLI server in a subprocess on loopback, reads its resident memory (VmRSS in
/proc) after one small request (the baseline), then sends N heavy valid requests (each the
largest the default limits accept: 512 distinct queries, topk 100, with scores; an answer of
about 30 MB of JSON), C at a time, and reads it again just after the burst and after a short
idle wait. Prints one JSON line: MB at each point, the peak (VmHWM), and the seconds taken.

    python benchmarks/bench_server_memory.py                      # flat index over 2,000 passages
    python benchmarks/bench_server_memory.py --requests 20 --concurrency 4 --index bm25 --limit 0
    python benchmarks/bench_server_memory.py --python /other/venv/bin/python   # another checkout's server

Not a test: it takes a minute or more of CPU (run it under the heavy-job lock).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

from bench_serve_load import start_server  # benchmarks/ is on the path when a script in it runs

WORDS = ["inventor", "telephone", "Ibsen", "play", "capital", "Norway", "river", "king", "war", "painter"]


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS (now) and VmHWM (peak) of a process, in MB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text(encoding="ascii").splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def post(url: str, payload: dict) -> int:
    parsed = urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=600)
    try:
        conn.request("POST", "/retrieve", json.dumps(payload).encode(), {"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def heavy(i: int) -> dict:
    """The largest request the default limits accept; distinct queries, so nothing is reused."""
    queries = [f"{WORDS[(i + q) % len(WORDS)]} {WORDS[(i * 7 + q * 3) % len(WORDS)]} {i}-{q}" for q in range(512)]
    return {"queries": queries, "topk": 100, "return_scores": True}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs the server")
    parser.add_argument("--index", default="flat", help="index type (default: flat)")
    parser.add_argument("--limit", type=int, default=2000, help="passages indexed, 0 for all (default: 2000)")
    parser.add_argument("--requests", type=int, default=20, help="heavy requests (default: 20)")
    parser.add_argument("--concurrency", type=int, default=4, help="sent at a time (default: 4)")
    parser.add_argument("--idle", type=float, default=3.0, help="seconds to wait before the last reading (default: 3)")
    args = parser.parse_args()

    proc, url = start_server(args.index, args.limit, args.python)
    try:
        assert post(url, {"queries": ["warm up"], "topk": 3}) == 200
        base = memory_mb(proc.pid)
        statuses: list[int] = []
        lock = threading.Lock()
        todo = iter(range(args.requests))

        def worker() -> None:
            while True:
                with lock:
                    i = next(todo, None)
                if i is None:
                    return
                status = post(url, heavy(i))
                with lock:
                    statuses.append(status)

        t0 = time.perf_counter()
        threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.perf_counter() - t0
        after = memory_mb(proc.pid)
        time.sleep(args.idle)
        idle = memory_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(json.dumps({
        "index": args.index, "limit": args.limit, "requests": args.requests, "concurrency": args.concurrency,
        "ok": statuses.count(200), "seconds": round(seconds, 1), "rss_base_mb": round(base["VmRSS"]),
        "rss_after_mb": round(after["VmRSS"]), "rss_idle_mb": round(idle["VmRSS"]), "peak_mb": round(idle["VmHWM"]),
        "load_avg": os.getloadavg()[0],
    }))  # fmt: skip
    return 0 if statuses.count(200) == args.requests else 1


if __name__ == "__main__":
    sys.exit(main())
