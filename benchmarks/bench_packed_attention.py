"""Attention in the packed update on long rows: per leaf, one [P, P] ancestor mask, and run attention.

The default QA trees of an untrained model have short rows, where attention is a small share of
the update (``bench_rl_step.py``). A trained agent's rows are long: the Search-R1 prompt, retrieved
passages, several turns. This benchmark builds such a micro-batch from random tokens with real
shapes (``--prompt`` shared tokens; ``--trees`` trees, each a first turn and a ``--obs``-token
observation; ``--leaves`` leaves per tree, each a second turn, a second observation and an
answer) and times SmolLM2's forward and backward over it three ways, side by side, in wall and CPU
seconds:

- per leaf: the rows as a padded batch;
- packed with one ``[P, P]`` ancestor mask (what ``packing.py`` did before run attention);
- packed with run attention (the default).

    python benchmarks/bench_packed_attention.py --reps 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from treegym.agents.models import load_model
from treegym.trainers.logprobs import TokenScorer
from treegym.trainers.packing import pack_rows


def tree_rows(args: argparse.Namespace) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)

    def rand(n: int) -> list[int]:
        return torch.randint(100, 40_000, (n,), generator=g).tolist()

    prompt, rows, masks = rand(args.prompt), [], []
    for _ in range(args.trees):
        turn, obs = rand(40), rand(args.obs)
        for _ in range(args.leaves):
            parts = [(prompt, 0), (turn, 1), (obs, 0), (rand(40), 1), (rand(args.obs // 2), 0), (rand(30), 1)]
            rows.append([t for p, _ in parts for t in p])
            masks.append([m for p, m in parts for _ in p])
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    attn = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    mask = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.float)[:, 1:]
    return ids, attn, mask


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt", type=int, default=400, help="shared prompt tokens")
    ap.add_argument("--obs", type=int, default=300, help="tokens of a first-turn observation")
    ap.add_argument("--trees", type=int, default=2)
    ap.add_argument("--leaves", type=int, default=2, help="leaves per tree (rows = trees x leaves)")
    ap.add_argument("--reps", type=int, default=2, help="runs per variant, alternating (median reported)")
    args = ap.parse_args()
    model, _ = load_model("smollm2")
    model.train()
    scorer = TokenScorer(model)
    ids, attn, mask = tree_rows(args)
    packed = pack_rows(ids, attn, mask)
    from treegym.trainers import logprobs, packing

    variants = {"per leaf": (None, True), "packed, [P,P] mask": (packed, False), "packed, run attention": (packed, True)}
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
    for _ in range(args.reps):
        for name, (p, runs) in variants.items():
            logprobs.runs_supported = packing.runs_supported if runs else (lambda config: False)
            model.zero_grad(set_to_none=True)
            t0, c0 = time.perf_counter(), time.process_time()
            logp, _ = scorer(ids, attn, ids[:, 1:], mask, with_entropy=True, packed=p)
            logp.sum().backward()
            times[name].append((time.perf_counter() - t0, time.process_time() - c0))
    logprobs.runs_supported = packing.runs_supported
    load = os.getloadavg()
    rows_tokens = int(attn.sum())
    area = sum((r.end - r.start) * len(r.keys) for r in packed.runs)
    print(f"{len(ids)} rows, {rows_tokens} row tokens, {packed.total} packed (ratio {packed.total / rows_tokens:.2f}); "
          f"attention area per head: per leaf {len(ids) * ids.shape[1] ** 2:,}, [P,P] {packed.total ** 2:,}, runs {area:,}; "
          f"torch threads {torch.get_num_threads()}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    base = statistics.median(c for _, c in times["per leaf"])
    print(f"{'forward + backward':24}{'wall s':>9}{'CPU s':>9}{'vs per leaf (CPU)':>19}")
    for name, ts in times.items():
        wall, cpu = statistics.median(w for w, _ in ts), statistics.median(c for _, c in ts)
        print(f"{name:24}{wall:>9.1f}{cpu:>9.1f}{base / cpu:>18.2f}x")


if __name__ == "__main__":
    main()
