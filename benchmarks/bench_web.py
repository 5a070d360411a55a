"""WebSearchQA-v0 over a network with 50 ms latency: pool concurrency, and cache hits in a tree.

The local web runs in its own process (``treegym web serve --latency-ms 50``), so every
request really crosses a socket and waits 50 ms. Two measurements, side by side:

1. Concurrency: 64 envs each take the same two steps (a search, then browsing its top
   result), once one env after another with ``env.step``, once together with ``EnvPool``.
   Target: pool >= 10x faster.
2. Cache during tree expansion (Tree-GRPO, m=2 trees per prompt, n=2 nodes expanded per
   round, l=1 round): a seeded scripted agent grows each tree, expansions fork the env at
   the chosen node (``env.fork()``) and continue; forks repeat some of their ancestors' and
   siblings' requests. Counted at the server: requests paid versus distinct requests asked.
   Target: no request paid twice within a tree.

    python benchmarks/bench_web.py                 # 64 envs, 8 prompts, full corpus
    python benchmarks/bench_web.py --envs 16 --prompts 2 --limit 2000
"""

from __future__ import annotations

import argparse
import random
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from treegym.envs import EnvPool
from treegym.envs.web.http import HttpConfig
from treegym.envs.web_search_qa import WebSearchQAEnv


def start_server(latency_ms: float, limit: int | None) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "treegym.cli", "web", "serve", "--port", "0", "--latency-ms", str(latency_ms)]
    if limit:
        cmd += ["--limit", str(limit)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    m = re.search(r"http://127\.0\.0\.1:\d+", line)
    if not m:
        proc.kill()
        raise SystemExit(f"the local web did not start: {line!r}")
    return proc, m.group(0)


def server_requests(url: str) -> int:
    return int(requests.get(f"{url}/health", timeout=10).json()["requests"])


def make_envs(n: int, url: str, http: HttpConfig, cache: bool, cache_path: str) -> list[WebSearchQAEnv]:
    return [WebSearchQAEnv(dataset="wiki", split="train", search_url=url, http=http, cache=cache,
                           cache_path=cache_path, page_chars=1500) for _ in range(n)]


def first_url(obs: str) -> str:
    m = re.search(r"URL: (\S+)", obs)
    return m.group(1) if m else "http://127.0.0.1:9/none"


def bench_concurrency(url: str, n: int, http: HttpConfig, tmp: str) -> None:
    envs = make_envs(n, url, http, cache=False, cache_path=f"{tmp}/unused.sqlite")
    for i, env in enumerate(envs):
        env.reset(seed=i)
    questions = [env.state.item.question for env in envs]
    start = [env.snapshot() for env in envs]
    search = [f"<think>look it up</think><search>{q}</search>" for q in questions]

    def run_sequential() -> float:
        for env, s in zip(envs, start):
            env.restore(s)
        t0 = time.perf_counter()
        obs = [env.step(a)[0] for env, a in zip(envs, search)]
        for env, o in zip(envs, obs):
            env.step(f"<browse>{first_url(o)}</browse>")
        return time.perf_counter() - t0

    def run_pool() -> float:
        for env, s in zip(envs, start):
            env.restore(s)
        pool = EnvPool()
        t0 = time.perf_counter()
        out = pool.step(envs, search)
        pool.step(envs, [f"<browse>{first_url(out[i][0])}</browse>" for i in range(n)])
        return time.perf_counter() - t0

    run_pool()  # warm: connections open, code paths loaded
    before = server_requests(url)
    seq = run_sequential()
    mid = server_requests(url)
    par = run_pool()
    after = server_requests(url)
    print(f"\n== concurrency: {n} envs x 2 steps (search, browse), 50 ms per request, per-host cap {http.per_host} ==")
    print(f"one after another : {seq:7.3f} s  ({mid - before - 1} requests, {(mid - before - 1) / seq:6.1f} req/s)")
    print(f"EnvPool           : {par:7.3f} s  ({after - mid - 1} requests, {(after - mid - 1) / par:6.1f} req/s)")
    print(f"speed-up          : {seq / par:7.1f}x   (target >= 10x)")


@dataclass
class TreeCount:
    calls: int = 0
    asked: set = field(default_factory=set)


class ScriptedAgent:
    """A seeded stand-in for a sampling policy: search the question or a rephrasing, browse
    one of the top results, maybe search again, then answer. Its few choices make sibling
    branches repeat requests, as sampled LLM branches do."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def act(self, question: str, turn: int, last_obs: str) -> str:
        urls = re.findall(r"URL: (\S+)", last_obs)
        if turn == 0 or (turn == 2 and self.rng.random() < 0.5):
            words = [w for w in re.findall(r"\w+", question) if len(w) > 3]
            q = self.rng.choice([question, " ".join(words), " ".join(words[:3]) or question])
            return f"<think>search</think><search>{q}</search>"
        if urls and turn < 3:
            return f"<think>read</think><browse>{self.rng.choice(urls[:2])}</browse>"
        return "<think>answer</think><answer>unknown</answer>"


def record(count: TreeCount, action: str) -> None:
    m = re.search(r"<(search|browse)>(.*?)</\1>", action)
    if m:
        count.calls += 1
        count.asked.add((m.group(1), m.group(2).split("#")[0]))


def bench_tree_cache(url: str, prompts: int, http: HttpConfig, tmp: str, m: int = 2, n: int = 2, rounds: int = 1) -> None:
    env0 = make_envs(1, url, http, cache=True, cache_path=f"{tmp}/tree-cache.sqlite")[0]
    cache = env0.cache
    rng = random.Random(0)
    total_calls = total_unique = total_paid = worst_repeats = 0
    hits0, misses0 = cache.stats.hits, cache.stats.misses
    for p in range(prompts):
        count = TreeCount()
        paid_before = server_requests(url)
        # m trees per prompt: each starts as one chain; every turn keeps a fork of its node.
        trees = []
        for _ in range(m):
            env = env0.fork()
            obs, _ = env.reset(seed=p)
            question = env.state.item.question
            nodes, last, turn, done = [], obs, 0, False
            while not done:
                nodes.append((env.fork(), turn, last))
                action = ScriptedAgent(rng).act(question, turn, last)
                record(count, action)
                last, _, term, trunc, _ = env.step(action)
                turn, done = turn + 1, term or trunc
            trees.append((question, nodes))
        # l rounds: expand n nodes per tree, all branches stepped together in one pool.
        for _ in range(rounds):
            branches = []
            for question, nodes in trees:
                for node_env, turn, last in rng.sample(nodes, min(n, len(nodes))):
                    branches.append([node_env.fork(), question, turn, last, False])
            while any(not b[4] for b in branches):
                live = [b for b in branches if not b[4]]
                pool = EnvPool()
                actions = [ScriptedAgent(rng).act(b[1], b[2], b[3]) for b in live]
                for a in actions:
                    record(count, a)
                out = pool.step([b[0] for b in live], actions)
                for i, b in enumerate(live):
                    obs, _, term, trunc, _ = out[i]
                    b[2], b[3], b[4] = b[2] + 1, obs, term or trunc
        paid = server_requests(url) - paid_before - 1  # the /health probe itself counts once
        total_calls += count.calls
        total_unique += len(count.asked)
        total_paid += paid
        worst_repeats = max(worst_repeats, paid - len(count.asked))
    hits, misses = cache.stats.hits - hits0, cache.stats.misses - misses0
    print(f"\n== cache during tree expansion: {prompts} prompts, m={m} trees, n={n}, l={rounds}, forks via env.fork() ==")
    print(f"tool calls made by all branches : {total_calls}")
    print(f"distinct requests among them    : {total_unique}")
    print(f"requests paid at the server     : {total_paid}")
    print(f"cache hits / lookups            : {hits} / {hits + misses}  (hit rate {hits / max(1, hits + misses):.1%})")
    print(f"without the cache, paid would be: {total_calls}  ({total_calls / max(1, total_paid):.2f}x more)")
    print(f"requests paid twice in a tree   : max {max(0, worst_repeats)}   (target 0)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", type=int, default=64, help="envs in the pool (default 64)")
    ap.add_argument("--prompts", type=int, default=8, help="prompts for the tree benchmark (default 8)")
    ap.add_argument("--latency-ms", type=float, default=50.0, help="server latency per request (default 50)")
    ap.add_argument("--limit", type=int, default=None, help="serve only the first N documents")
    ap.add_argument("--per-host", type=int, default=HttpConfig().per_host, help="concurrent requests per host")
    args = ap.parse_args()
    http = HttpConfig(per_host=args.per_host)
    proc, url = start_server(args.latency_ms, args.limit)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            print(f"local web: {url} (own process, {args.latency_ms:g} ms latency); tmp cache in {Path(tmp)}")
            bench_concurrency(url, args.envs, http, tmp)
            bench_tree_cache(url, args.prompts, http, tmp)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
