"""TextHousehold-v0 against ALFWorld's real engine: expert steps per second, and fork latency.

Run: ``python benchmarks/bench_household.py [--tasks 60] [--real-tasks 12] [--all-tasks]``.

1. The expert walkthrough of the same tasks on our engine and on ALFWorld's TextWorld engine
   (our PDDL export on ALFWorld's domain; needs the ``household`` extra). Steps per second
   count ``step`` calls only; loading and reset are reported apart.
2. Fork latency after 1 and 50 steps (median, µs): ``env.fork()``, snapshot+restore, against
   replaying the actions from a reset on our engine and on TextWorld (whose ``copy()`` is not
   implemented for PDDL games; that is reported too).
3. With ``--all-tasks``: the expert's win rate on every task of every split (must be 100%).
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import time
from collections.abc import Callable

from treegym.envs.household.env import TextHouseholdEnv
from treegym.envs.household.planner import walkthrough
from treegym.envs.household.tasks import TASK_TYPES, make_task, task_ids


def _sample(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    splits = ("train", "seen", "unseen")
    return [rng.choice(task_ids(splits[k % 3], (TASK_TYPES[k % 6],))) for k in range(n)]


def _median_us(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def ours_steps(tids: list[str], repeats: int = 3) -> tuple[float, float, int]:
    """(steps/s over step calls only, resets/s, steps per pass), best of ``repeats`` passes."""
    plans = {t: walkthrough(make_task(t)) for t in tids}
    env = TextHouseholdEnv(max_steps=1000)
    best_step, best_reset, steps = 0.0, 0.0, 0
    for _ in range(repeats):
        step_time = reset_time = 0.0
        steps = 0
        for t, plan in plans.items():
            t0 = time.perf_counter()
            env.reset(options={"task_id": t})
            t1 = time.perf_counter()
            for cmd in plan:
                env.step(cmd)
            reset_time += t1 - t0
            step_time += time.perf_counter() - t1
            steps += len(plan)
        best_step, best_reset = max(best_step, steps / step_time), max(best_reset, len(plans) / reset_time)
    return best_step, best_reset, steps


def real_steps(tids: list[str]) -> tuple[float, float, float, int]:
    """(steps/s, mean load s, mean reset s, steps) of the expert on ALFWorld's engine."""
    from treegym.envs.household.reference import RealEngine

    step_time = load_time = reset_time = 0.0
    steps = 0
    for t in tids:
        task = make_task(t)
        t0 = time.perf_counter()
        real = RealEngine(task)
        t1 = time.perf_counter()
        real.reset()
        t2 = time.perf_counter()
        for cmd in walkthrough(task):
            out = real.step(cmd)
        step_time += time.perf_counter() - t2
        load_time, reset_time = load_time + t1 - t0, reset_time + t2 - t1
        steps += len(walkthrough(task))
        assert out.won, f"the expert did not win {t} on the real engine"
    return steps / step_time, load_time / len(tids), reset_time / len(tids), steps


def _long_episode(task_id: str, n: int) -> list[str]:
    """``n`` admissible commands: walk the room, opening and closing what opens."""
    world = make_task(task_id).world
    cmds: list[str] = []
    while len(cmds) < n:
        for rec in world.receptacles:
            cmds.append(f"go to {rec.name}")
            if rec.openable:
                cmds += [f"open {rec.name}", f"close {rec.name}"]
    return cmds[:n]


def fork_latency(task_id: str, with_real: bool, reps: int) -> tuple[list[tuple[str, float, float]], list[str]]:
    """Rows (method, µs after 1 step, µs after 50 steps), and notes on what could not be measured."""
    rows, notes = [], []
    results: dict[tuple[str, int], float] = {}
    for k in (1, 50):
        cmds = _long_episode(task_id, k)
        env = TextHouseholdEnv(max_steps=1000)
        env.reset(options={"task_id": task_id})
        for c in cmds:
            env.step(c)
        snap = env.snapshot()
        results[("fork", k)] = _median_us(env.fork, reps)
        results[("snapshot+restore", k)] = _median_us(lambda e=env, s=snap: (e.snapshot(), e.restore(s)), reps)

        def replay(cmds: list[str] = cmds) -> None:
            e = TextHouseholdEnv(max_steps=1000)
            e.reset(options={"task_id": task_id})
            for c in cmds:
                e.step(c)

        results[("replay (ours)", k)] = _median_us(replay, max(5, reps // 50))
        if with_real:
            from treegym.envs.household.reference import RealEngine

            real = RealEngine(make_task(task_id))

            def real_replay(cmds: list[str] = cmds, real: RealEngine = real) -> None:
                real.reset()
                for c in cmds:
                    real.step(c)

            results[("replay (TextWorld)", k)] = _median_us(real_replay, 3)
            try:
                real.reset()
                for c in cmds:
                    real.step(c)
                results[("copy (TextWorld)", k)] = _median_us(lambda r=real: r.env.copy(), 3)
            except Exception as exc:  # PddlEnv keeps its state inside Fast Downward's C library
                results[("copy (TextWorld)", k)] = float("nan")
                notes.append(f"TextWorld env.copy() after {k} steps: not possible ({type(exc).__name__})")
            try:
                copy.deepcopy(real.env)
                notes.append("copy.deepcopy of the TextWorld env succeeded, but Fast Downward's C state stays shared")
            except Exception as exc:
                notes.append(f"copy.deepcopy of the TextWorld env after {k} steps: not possible ({type(exc).__name__}: {str(exc)[:60]})")
    for name in ("fork", "snapshot+restore", "replay (ours)", "replay (TextWorld)", "copy (TextWorld)"):
        if (name, 1) in results:
            rows.append((name, results[(name, 1)], results[(name, 50)]))
    return rows, notes


def sweep() -> None:
    """Play the expert on every task of every split; print the win rate."""
    from tqdm import tqdm

    for split in ("train", "seen", "unseen"):
        env = TextHouseholdEnv(split=split)
        ids = task_ids(split)
        wins = 0
        for t in tqdm(ids, desc=f"expert on {split}", leave=False):
            env.reset(options={"task_id": t})
            info: dict = {}
            for cmd in walkthrough(make_task(t)):
                info = env.step(cmd)[4]
            wins += bool(info.get("won"))
        print(f"expert wins {wins}/{len(ids)} tasks of {split} ({100 * wins / len(ids):.1f}%)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=60, help="tasks for our engine's expert throughput")
    parser.add_argument("--real-tasks", type=int, default=12, help="tasks played on the real ALFWorld engine (0: skip)")
    parser.add_argument("--fork-reps", type=int, default=2000, help="repetitions per fork latency figure")
    parser.add_argument("--all-tasks", action="store_true", help="also play the expert on every task of every split")
    args = parser.parse_args()
    try:
        import alfworld  # noqa: F401
        have_real = args.real_tasks > 0
    except ImportError:
        have_real = False
        print("alfworld is not installed: real-engine figures skipped (pip install 'treegym[household]')")

    tids = _sample(max(args.tasks, args.real_tasks))
    sps, rps, n = ours_steps(tids)
    print(f"ours, {len(tids)} tasks, {n} expert steps: {sps:,.0f} steps/s, {rps:,.0f} resets/s")
    if have_real:
        same = tids[: args.real_tasks]
        ours_same, _, n_same = ours_steps(same)
        real_sps, load_s, reset_s, n_real = real_steps(same)
        print(f"\nexpert on the same {len(same)} tasks ({n_real} steps)")
        print(f"  {'engine':<22}{'steps/s':>12}")
        print(f"  {'TextHousehold (ours)':<22}{ours_same:>12,.0f}")
        print(f"  {'ALFWorld TextWorld':<22}{real_sps:>12,.1f}   (+ load {load_s:.2f} s, reset {reset_s * 1e3:.0f} ms per task)")
        print(f"  ratio ours/real: {ours_same / real_sps:,.0f}x  (target >= 100x)")

    print(f"\nfork latency, task {tids[0]} (median, µs)")
    print(f"  {'method':<22}{'after 1 step':>14}{'after 50 steps':>16}")
    rows, notes = fork_latency(tids[0], have_real, args.fork_reps)
    for name, a, b in rows:
        if a == a:  # NaN: not measurable
            print(f"  {name:<22}{a:>14,.1f}{b:>16,.1f}")
        else:
            print(f"  {name:<22}{'n/a':>14}{'n/a':>16}")
    fork = dict((name, (a, b)) for name, a, b in rows)["fork"]
    for name, a, b in rows:
        if name != "fork" and a == a:
            print(f"  {name} / fork: {a / fork[0]:,.0f}x after 1, {b / fork[1]:,.0f}x after 50")
    for note in dict.fromkeys(notes):
        print(f"  note: {note}")
    if args.all_tasks:
        print()
        sweep()


if __name__ == "__main__":
    main()
