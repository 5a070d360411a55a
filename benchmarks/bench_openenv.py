"""Latency of ``treegym serve-env`` on loopback: the fork/snapshot/restore routes and household steps.

Starts the real OpenEnv server in this process (``treegym.integrations.openenv.serve``, a
uvicorn thread on 127.0.0.1), then times, each on one keep-alive connection:

- ``POST /fork``, ``/snapshot`` and ``/restore`` over HTTP (``http.client``; each fork's child
  is left to expire, so the store gets a limit above the number of forks made);
- TextHousehold-v0 steps over the WebSocket, with OpenEnv's own client (``.sync()``).

Prints the median and p90 per operation in milliseconds. Targets (issue 24): the three routes
under 2 ms median, household steps at 0.5 ms or less. Before TCP_NODELAY was set on the
server's socket, every HTTP request took about 44 ms (the client's delayed ACK). Example:

    python benchmarks/bench_openenv.py --repeats 300
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import time
from collections.abc import Callable

import treegym  # noqa: F401  (registers the envs)
from treegym.integrations.openenv import SESSION_HEADER, TreegymEnvClient, serve


def timings(fn: Callable[[], object], repeats: int, warmup: int = 20) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def row(name: str, ms: list[float]) -> str:
    ms = sorted(ms)
    return f"{name:<28} median {statistics.median(ms):7.3f} ms   p90 {ms[int(0.9 * (len(ms) - 1))]:7.3f} ms   n={len(ms)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=300, help="timed calls per operation (default 300)")
    args = parser.parse_args()

    room = 4 * args.repeats + 100
    server = serve("TextHousehold-v0", port=0, max_episodes=room, max_forks=room, max_snapshots=room,
                   max_session_snapshots=room).start()
    try:
        with TreegymEnvClient(server.url).sync() as env:
            env.reset(seed=0)
            episode, token = env.state().episode_id, env.session_token()
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)

            def post(path: str, body: dict) -> dict:
                conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json",
                                                              SESSION_HEADER: token})
                response = conn.getresponse()
                payload = json.loads(response.read())
                assert response.status == 200, payload
                return payload

            snap = post("/snapshot", {"episode_id": episode})["snapshot_id"]
            print(f"treegym serve-env TextHousehold-v0 on {server.url}")
            print(row("POST /fork", timings(lambda: post("/fork", {"episode_id": episode}), args.repeats)))
            print(row("POST /snapshot", timings(lambda: post("/snapshot", {"episode_id": episode}), args.repeats)))
            print(row("POST /restore", timings(
                lambda: post("/restore", {"episode_id": episode, "snapshot_id": snap}), args.repeats)))
            conn.close()

            # look and inventory never win, so only the step budget (max_steps, 50) ends an episode:
            # reset before it, untimed, so that every timed call is a real step.
            steps = []
            for i in range(args.repeats + 20):
                if i % 40 == 0:
                    env.reset(seed=i)
                t0 = time.perf_counter()
                env.step("look" if i % 2 else "inventory")
                steps.append((time.perf_counter() - t0) * 1e3)
            print(row("WebSocket step (household)", steps[20:]))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
