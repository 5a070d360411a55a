"""Fork latency of TreeSearchQA-v0 at turn 1 and turn 10, against the ways one forks without it.

Baselines, measured side by side in the same run:
- deepcopy: ``copy.deepcopy`` of everything on the env except the shared index (what a generic
  "copy the env" does: dataset, config, state);
- replay: a fresh reset plus re-stepping every action so far (what a trainer without fork does;
  it pays every search again).

Targets (issue 2): median fork <= 50 µs, turn-10 / turn-1 <= 1.5.

Through ``gym.make``'s wrappers (issue 11): ``treegym.envs.fork(wrapped)`` against the bare
env's ``fork()`` and against ``copy.deepcopy(wrapped)``, side by side. Target: at most 2x bare.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import gymnasium as gym

import treegym  # registers the envs
import treegym.envs


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
    wrapped = gym.make("TreeSearchQA-v0", corpus_limit=args.corpus_limit, max_turns=50)
    wrapped.reset(seed=0)
    wrapped.step("<search>Rome</search>")
    bare = wrapped.unwrapped
    bare_us = _median_us(bare.fork, args.repeats)
    wrapped_us = _median_us(lambda: treegym.envs.fork(wrapped), args.repeats)
    deep_wrapped_us = _median_us(lambda: copy.deepcopy(wrapped), max(20, args.repeats // 10))
    print(f"gym.make env ({type(wrapped).__name__} over {type(bare).__name__}): bare fork {bare_us:.1f} µs, "
          f"treegym.envs.fork {wrapped_us:.1f} µs ({wrapped_us / bare_us:.2f}x bare; target <= 2), "
          f"copy.deepcopy {deep_wrapped_us:.1f} µs ({deep_wrapped_us / bare_us:.1f}x bare)")
    growth = results[10] / results[1]
    print(f"turn-10 / turn-1 fork latency: {growth:.2f} (target <= 1.5); median at turn 10: {results[10]:.1f} µs (target <= 50)")


if __name__ == "__main__":
    main()
