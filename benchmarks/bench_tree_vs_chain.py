"""Trajectories per 1,000 generated tokens: Tree-GRPO trees against GRPO chains, equal budget.

Both samplers draw from the same policy (SmolLM2-135M-Instruct on CPU by default) on the same
TreeSearchQA-v0 slice, batch after batch over the same prompts, until each has generated at
least ``--budget`` tokens. A tree's branches share their ancestors' turns, so for the same
generated tokens it yields more trajectories; the chain group size defaults to the number of
leaves a tree search keeps per prompt (m x k), so both give the trainer equally large groups.

    python benchmarks/bench_tree_vs_chain.py --budget 2000
    python benchmarks/bench_tree_vs_chain.py --budget 4000 --m 2 --n 2 --l 1 --k 3 --max-turns 4
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # main() imports it, once TOKENIZERS_PARALLELISM is set
    from treegym.agents.rollout import Budget


@dataclass
class Tally:
    """One sampler's run: its batches' summed cost, how many there were, and their wall time."""

    budget: Budget
    batches: int = 0
    seconds: float = 0.0

    def per_1k(self) -> float:
        return 1000.0 * self.budget.trajectories / max(1, self.budget.generated_tokens)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2", help="smollm2 or a local HF model folder")
    p.add_argument("--budget", type=int, default=2000, help="generated tokens per sampler (default 2000)")
    p.add_argument("--prompts", type=int, default=2, help="prompts per batch (default 2)")
    p.add_argument("--m", type=int, default=2)
    p.add_argument("--n", type=int, default=2)
    p.add_argument("--l", type=int, default=1)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--group-size", type=int, default=None, help="chains per prompt (default m*k)")
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--mode", choices=("chat", "raw"), default="chat")
    p.add_argument("--corpus-limit", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import gymnasium as gym
    import torch
    from tqdm.auto import tqdm

    import treegym  # noqa: F401
    from treegym.agents.hf_policy import HFPolicy
    from treegym.agents.policy import SamplingParams
    from treegym.agents.rollout import Budget
    from treegym.agents.rollout.samplers import sample_chains, sample_trees

    if args.threads:
        torch.set_num_threads(args.threads)
    policy = HFPolicy.from_pretrained(args.model, device="cpu")
    env = gym.make("TreeSearchQA-v0", corpus_limit=args.corpus_limit)
    items = env.unwrapped.items
    group = args.group_size or args.m * args.k
    params = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed)

    def run(kind: str) -> Tally:
        tally = Tally(Budget())
        bar = tqdm(total=args.budget, desc=kind, unit="tok")
        while tally.budget.generated_tokens < args.budget:
            start = (tally.batches * args.prompts) % len(items)
            prompts = [{"task_id": items[(start + i) % len(items)].id} for i in range(args.prompts)]
            policy.clear_cache()  # each batch pays its own prefill, as a fresh policy would
            t0 = time.perf_counter()
            if kind == "chain":
                batch = sample_chains(policy, env, prompts, group, params=params, max_turns=args.max_turns, mode=args.mode)
            else:
                batch = sample_trees(policy, env, prompts, m=args.m, n=args.n, l=args.l, k=args.k, params=params,
                                     max_turns=args.max_turns, mode=args.mode, seed=args.seed + tally.batches)
            tally.seconds += time.perf_counter() - t0
            tally.batches += 1
            tally.budget += batch.budget
            bar.update(batch.budget.generated_tokens)
        bar.close()
        return tally

    chain = run("chain")
    tree = run("tree")
    print(f"\nTreeSearchQA-v0 (corpus_limit={args.corpus_limit}), {args.model}, max_turns={args.max_turns}, "
          f"max_new_tokens={args.max_new_tokens}, T={args.temperature}, {args.mode} mode")
    print(f"chain: G={group} per prompt; tree: m={args.m} n={args.n} l={args.l} k={args.k}; {args.prompts} prompts per batch")
    header = f"{'sampler':<8}{'batches':>8}{'traj':>6}{'gen tok':>9}{'traj/1k tok':>13}{'turns':>7}{'tool calls':>11}{'prefill':>9}{'reused':>8}{'wall s':>8}"
    print(header)
    print("-" * len(header))
    for name, t in (("chain", chain), ("tree", tree)):
        b = t.budget
        print(f"{name:<8}{t.batches:>8}{b.trajectories:>6}{b.generated_tokens:>9}{t.per_1k():>13.2f}{b.env_steps:>7}"
              f"{b.tool_calls:>11}{b.prefill_tokens:>9}{b.reused_tokens:>8}{t.seconds:>8.1f}")
    print(f"tree / chain, trajectories per 1k generated tokens: {tree.per_1k() / max(chain.per_1k(), 1e-9):.2f}x")
    print(f"tree / chain, trajectories per wall second: "
          f"{(tree.budget.trajectories / max(tree.seconds, 1e-9)) / max(chain.budget.trajectories / max(chain.seconds, 1e-9), 1e-9):.2f}x")


if __name__ == "__main__":
    main()
