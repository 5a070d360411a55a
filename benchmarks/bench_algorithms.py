"""GRPO vs Tree-GRPO vs TreeOPSD at an equal rollout budget (generated tokens).

Each algorithm trains from the same initial model on the same env with the same seeds until
it has generated ``--token-budget`` rollout tokens; held-out EM is measured every
``--eval-every`` steps. The script plots held-out EM against generated tokens (mean over
seeds) and prints the final table.

Presets:
  qa         TreeSearchQA-v0 with SmolLM2-135M-Instruct (the product's default job)
  tiny-keys  a 4-turn task (say A, B, C, D; tests/tiny_task.py) with a tiny random
             transformer: small enough to train to convergence on a CPU in minutes

    python benchmarks/bench_algorithms.py --preset tiny-keys --token-budget 3000 --seeds 0 1 2
    python benchmarks/bench_algorithms.py --preset qa --token-budget 20000 --seeds 0
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ALGOS = ("grpo", "tree-grpo", "treeopsd")


def preset_overrides(args: argparse.Namespace) -> dict[str, Any]:
    if args.preset == "tiny-keys":
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from tiny_task import build_tiny_model

        from treegym.paths import cache_dir

        model = build_tiny_model(cache_dir("test-models") / "tiny-keys-v1")
        return {
            "env": "tiny_task:TinyKeysEnv", "model": str(model), "env_kwargs": {"max_turns": 4},
            "sampler.max_turns": 4, "sampler.max_new_tokens": 1, "optim.lr": args.lr or 3e-3,
            "prompts_per_step": args.prompts_per_step or 2, "run.eval_n": args.eval_n or 8,
            "optim.mini_batch_size": 12, "optim.micro_batch_size": 12,
        }  # fmt: skip
    return {
        "env": "TreeSearchQA-v0", "model": "smollm2", "env_kwargs": args.env_kwargs or {},
        "sampler.max_turns": args.max_turns, "sampler.max_new_tokens": args.max_new_tokens,
        "optim.lr": args.lr or 2e-5, "prompts_per_step": args.prompts_per_step or 2, "run.eval_n": args.eval_n or 32,
    }  # fmt: skip


def run_one(algo: str, seed: int, args: argparse.Namespace, base: dict[str, Any]) -> dict[str, Any]:
    from treegym.trainers.config import load_config
    from treegym.trainers.loop import train

    overrides = {**base, "algo": algo, "seed": seed, "steps": 10**6, "token_budget": args.token_budget,
                 "run.out_dir": str(args.out), "run.name": f"{args.preset}-{algo}-s{seed}", "run.resume": False,
                 "run.eval_every": args.eval_every, "run.save_every": 0, "run.tensorboard": False,
                 "run.trees_html": False}  # fmt: skip
    cfg = load_config(overrides=list(overrides.items()))
    t0 = time.time()
    result = train(cfg, progress=not args.quiet)
    evals = [(h["tokens_total"], h["eval_success"]) for h in result.history if "eval_success" in h]
    steps = [h for h in result.history if "reward" in h]
    return {
        "algo": algo, "seed": seed, "steps": result.steps, "tokens": result.tokens_total,
        "trajectories": sum(h["trajectories"] for h in steps), "em_before": result.success_before,
        "em_after": result.success_after, "evals": evals, "seconds": time.time() - t0,
        "reward_last": statistics.mean(h["reward"] for h in steps[-3:]) if steps else float("nan"),
        "reward_first": statistics.mean(h["reward"] for h in steps[:3]) if steps else float("nan"),
    }  # fmt: skip


def plot(results: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for algo in ALGOS:
        runs = [r for r in results if r["algo"] == algo]
        for i, r in enumerate(runs):
            xs, ys = zip(*r["evals"]) if r["evals"] else ((), ())
            ax.plot(xs, ys, marker=".", alpha=0.35 if len(runs) > 1 else 1.0, color=f"C{ALGOS.index(algo)}",
                    label=algo if i == 0 else None)
    ax.set_xlabel("generated rollout tokens")
    ax.set_ylabel("held-out EM")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(results: list[dict[str, Any]]) -> str:
    def ms(xs: list[float]) -> str:
        xs = [x for x in xs if x is not None]
        if not xs:
            return "n/a"
        return f"{statistics.mean(xs):.3f}" + (f" ± {statistics.stdev(xs):.3f}" if len(xs) > 1 else "")

    head = f"{'algorithm':<10} {'seeds':>5} {'steps':>6} {'tokens':>8} {'trajs':>6} {'EM before':>15} {'EM after':>15} " \
           f"{'reward first→last':>20} {'time':>7}"
    lines = [head, "-" * len(head)]
    for algo in ALGOS:
        rs = [r for r in results if r["algo"] == algo]
        if not rs:
            continue
        lines.append(
            f"{algo:<10} {len(rs):>5} {statistics.mean(r['steps'] for r in rs):>6.1f} "
            f"{statistics.mean(r['tokens'] for r in rs):>8.0f} {statistics.mean(r['trajectories'] for r in rs):>6.0f} "
            f"{ms([r['em_before'] for r in rs]):>15} {ms([r['em_after'] for r in rs]):>15} "
            f"{statistics.mean(r['reward_first'] for r in rs):>9.3f}→{statistics.mean(r['reward_last'] for r in rs):.3f} "
            f"{statistics.mean(r['seconds'] for r in rs):>6.0f}s"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=["qa", "tiny-keys"], default="qa")
    ap.add_argument("--algos", nargs="+", default=list(ALGOS), choices=ALGOS)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--token-budget", type=int, default=20000, help="generated rollout tokens per run")
    ap.add_argument("--eval-every", type=int, default=2, help="steps between held-out EM evaluations")
    ap.add_argument("--eval-n", type=int, default=0, help="held-out prompts (0 = preset default)")
    ap.add_argument("--prompts-per-step", type=int, default=0)
    ap.add_argument("--lr", type=float, default=0.0)
    ap.add_argument("--max-turns", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--env-kwargs", type=json.loads, default=None, help='JSON, e.g. \'{"index": "bm25"}\'')
    ap.add_argument("--out", type=Path, default=Path("runs/bench_algorithms"))
    ap.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                    help="extra config overrides for every run, e.g. advantage.normalize_std=true")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    base = preset_overrides(args)
    base.update(dict(kv.split("=", 1) for kv in args.set))
    print(f"preset {args.preset}: equal budget of {args.token_budget:,} generated tokens per run, "
          f"seeds {args.seeds}, algos {args.algos}", flush=True)
    results = []
    for seed in args.seeds:
        for algo in args.algos:
            r = run_one(algo, seed, args, base)
            results.append(r)
            print(f"  {algo:<10} seed {seed}: steps {r['steps']}, tokens {r['tokens']}, EM {r['em_before']} -> "
                  f"{r['em_after']}, reward {r['reward_first']:.3f} -> {r['reward_last']:.3f}, {r['seconds']:.0f}s",
                  flush=True)
            (args.out / f"results-{args.preset}.json").write_text(json.dumps(results, indent=1))
    plot(results, args.out / f"em_vs_tokens-{args.preset}.png", f"{args.preset}: held-out EM vs rollout tokens")
    print(table(results))
    print(f"plot: {args.out / f'em_vs_tokens-{args.preset}.png'}")


if __name__ == "__main__":
    main()
