"""Learning signal per generated token: chains (GRPO) against trees (Tree-GRPO, TreeOPSD), at init.

Samples the probe's format-prior model (no training) on many prompts with each sampler at a
per-prompt budget B, computes each algorithm's advantages exactly as the trainer does, and
prints side by side, per 1,000 generated tokens:

- trajectories, and distinct move sequences (what the env actually distinguishes);
- prompt groups with any learning signal (some advantage not 0), and successes found;
- action tokens whose advantage is not 0, and the mean |advantage| (PPO) or |r* - 1|
  (TreeOPSD's step weight) over all action tokens.

Advantages and the teacher map take the training config's defaults (``TrainConfig()``: TreeOPSD
blended with the outcome advantage, λ = 0.5, ε = 1), so the figures describe what a run trains.
This is where an equal-token comparison is decided before any update: more trajectories per
token only help if they are different trajectories with different outcomes.

    python benchmarks/bench_tree_signal.py --task lock --budget 2 4 8 --prompts 256
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def measure(task_name: str, budget: int, prompts: int, seed: int) -> list[dict[str, float | str]]:
    import gymnasium as gym

    import treegym  # noqa: F401
    from treegym.agents.hf_policy import HFPolicy
    from treegym.agents.models import load_model
    from treegym.agents.policy import SamplingParams
    from treegym.agents.rollout.samplers import sample_chains, sample_trees
    from treegym.envs.probe_model import build_probe_model
    from treegym.study.grid import TASKS
    from treegym.trainers.algorithms import get_algorithm
    from treegym.trainers.config import TrainConfig
    from treegym.trainers.losses import teacher_ratio

    cfg = TrainConfig()  # each algorithm's advantage and teacher map at the config's defaults, as trained

    task = TASKS[task_name]
    env = gym.make(task.env, horizon=task.horizon, choices=task.choices).unwrapped
    model, tok = load_model(str(build_probe_model(env, task.turn_tokens)), device="cpu")
    params = SamplingParams(max_new_tokens=task.turn_tokens, ignore_eos=True)
    common = {"max_turns": task.horizon, "mode": "raw"}
    ps = list(range(seed * 100_000, seed * 100_000 + prompts))
    rows = []
    for name, algo, sample in [
        ("grpo (chains)", "grpo", lambda p: sample_chains(HFPolicy(model, tok, seed=seed), env, p, budget, params, **common)),
        ("tree-grpo (reference)", "tree-grpo", lambda p: sample_trees(HFPolicy(model, tok, seed=seed), env, p, m=max(1, budget // 2),
                                                                       n=2, l=1, k=3, params=params, seed=seed, **common)),
        ("tree-grpo (n=1, l=2, mixed)", "tree-grpo", lambda p: sample_trees(HFPolicy(model, tok, seed=seed), env, p, m=max(1, budget // 2),
                                                                             n=1, l=2, k=3, params=params, expansion="mixed", seed=seed, **common)),
        ("treeopsd (reference)", "treeopsd", lambda p: sample_trees(HFPolicy(model, tok, seed=seed), env, p, m=max(1, budget // 2),
                                                                     n=2, l=1, k=3, params=params, seed=seed, **common)),
    ]:
        t0 = time.perf_counter()
        with torch.no_grad():
            batch = sample(ps)
        algorithm = get_algorithm(algo)
        adv = algorithm.advantage(batch.rollouts, **algorithm.advantage_options(cfg))
        tokens = batch.budget.generated_tokens
        trees = {(t.prompt_index, t.tree_index): t for t in batch.trees}
        moves = {(r.prompt_index, tuple(_first_word(trees[(r.prompt_index, r.tree_index)].nodes[i].turn.action_text)
                                        for i in r.node_path)) for r in batch.rollouts}
        groups: dict[int, bool] = {}
        action, nonzero, weight = 0, 0, 0.0
        for r, a in zip(batch.rollouts, adv.advantages):
            mask = torch.tensor(r.loss_mask, dtype=torch.bool)
            groups[r.prompt_index] = groups.get(r.prompt_index, False) or bool((a[mask] != 0).any())
            action += int(mask.sum())
            nonzero += int((a[mask] != 0).sum())
            w = (teacher_ratio(a[mask], cfg.loss.beta, cfg.loss.eps) - 1).abs() if algo == "treeopsd" else a[mask].abs()
            weight += float(w.sum())
        per_k = 1000 / max(tokens, 1)
        rows.append({
            "sampler": name, "trajectories": len(batch.rollouts) * per_k, "distinct": len(moves) * per_k,
            "signal_groups": sum(groups.values()) * per_k, "successes": sum(r.reward > 0 for r in batch.rollouts) * per_k,
            "nonzero_tokens": nonzero * per_k, "step_weight": weight / max(action, 1),
            "seconds": time.perf_counter() - t0,
        })  # fmt: skip
    return rows


def _first_word(text: str) -> str:
    words = text.split()
    return words[0] if words else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="lock", help="a task of treegym.study.grid.TASKS")
    ap.add_argument("--budget", type=int, nargs="+", default=[2, 4, 8], help="per-prompt budgets B")
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = ap.parse_args()
    torch.set_num_threads(1)
    head = (f"{'B':>2}  {'sampler':<28} {'trajs':>6} {'distinct':>8} {'signal groups':>13} {'successes':>9} "
            f"{'nonzero-adv tokens':>18} {'step weight':>11}   (per 1k generated tokens; mean over seeds)")
    print(f"task {args.task}, {args.prompts} prompts per sampler, untrained format-prior model")
    print(head)
    for b in args.budget:
        runs = [measure(args.task, b, args.prompts, s) for s in args.seeds]
        for i, row in enumerate(runs[0]):
            m = {k: statistics.fmean(r[i][k] for r in runs) for k in row if k != "sampler"}
            print(f"{b:>2}  {row['sampler']:<28} {m['trajectories']:>6.1f} {m['distinct']:>8.1f} {m['signal_groups']:>13.2f} "
                  f"{m['successes']:>9.2f} {m['nonzero_tokens']:>18.0f} {m['step_weight']:>11.3f}")


if __name__ == "__main__":
    main()
