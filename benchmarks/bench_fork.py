"""Fork latency of TreeSearchQA-v0 at turn 1 and turn 10, against the ways one forks without it.

Baselines, measured side by side in the same run:
- deepcopy: ``copy.deepcopy`` of everything on the env except the shared index (what a generic
  "copy the env" does: dataset, config, state);
- replay: a fresh reset plus re-stepping every action so far (what a trainer without fork does;
  it pays every search again).

Targets (issue 2): median fork <= 50 µs, turn-10 / turn-1 <= 1.5.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import gymnasium as gym

import treegym  # noqa: F401  (registers the envs)


def _median_us(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus-limit", type=int, default=1000, help="documents in the index slice")
    parser.add_argument("--repeats", type=int, default=2000, help="forks timed per measurement")
    parser.add_argument("--replay-repeats", type=int, default=20, help="replays timed per measurement")
    args = parser.parse_args()

    env = gym.make("TreeSearchQA-v0", corpus_limit=args.corpus_limit, max_turns=50).unwrapped
    queries = ["Rome", "Nile", "physics", "Mozart", "Moon", "Python", "Egypt", "chess", "opera", "tea"]
    print(f"{'turn':>5} {'fork µs':>9} {'deepcopy µs':>12} {'replay µs':>11} {'deepcopy/fork':>14} {'replay/fork':>12}")
    results = {}
    for turns in (1, 10):
        env.reset(seed=0)
        actions = [f"<search>{q}</search>" for q in queries[:turns]]
        for a in actions:
            env.step(a)
        fork_us = _median_us(env.fork, args.repeats)
        memo_base = {id(env.retriever): env.retriever, id(env.tools): env.tools}
        deep_us = _median_us(lambda memo=memo_base: copy.deepcopy(env.__dict__, dict(memo)), max(20, args.repeats // 50))

        def replay(actions=actions):
            e = env.fork()
            e.reset(seed=0)
            for a in actions:
                e.step(a)

        replay_us = _median_us(replay, args.replay_repeats)
        results[turns] = fork_us
        print(f"{turns:>5} {fork_us:>9.1f} {deep_us:>12.1f} {replay_us:>11.1f} {deep_us / fork_us:>14.0f}x {replay_us / fork_us:>11.0f}x")
    growth = results[10] / results[1]
    print(f"turn-10 / turn-1 fork latency: {growth:.2f} (target <= 1.5); median at turn 10: {results[10]:.1f} µs (target <= 50)")


if __name__ == "__main__":
    main()
