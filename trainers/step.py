"""One training step, after sampling: advantages -> old (and reference) log-probs with the
pre-update model -> the update (``treegym.trainers.update``) -> the step's logged quantities,
reduced over processes by name. ``treegym.trainers.loop`` calls it between ``sample`` and the
next step; ``benchmarks/bench_rl_step.py`` calls it on one batch, each update variant in turn.
"""

from __future__ import annotations

import math
import time
import warnings
from typing import TYPE_CHECKING

import torch

from treegym.agents.rollout.diagnostics import distinct_first_moves, effective_trajectories
from treegym.agents.rollout.distinct import distinct_action_share, distinct_share
from treegym.agents.rollout.types import RolloutBatch
from treegym.envs.core import failed_to_run, success
from treegym.errors import TreegymError
from treegym.trainers import parallel
from treegym.trainers import update as upd
from treegym.trainers.advantages import without_failed_runs
from treegym.trainers.logprobs import TokenScorer, pad_rollouts
from treegym.trainers.model import checkpointing_on, reference_scope

if TYPE_CHECKING:
    from treegym.trainers.loop import Run

MAX_NONFINITE_STREAK = 3
# running totals in every budget currency, kept in the train state for the held-out curves
CURRENCY_TOTALS = ("tool_calls_total", "trainer_tokens_total", "tool_rounds_total", "seconds_total")


class TrainingError(TreegymError):
    """Training cannot go on (e.g. the loss stayed non-finite)."""


def train_step(run: Run, batch: RolloutBatch) -> dict[str, float]:
    """Advantages, old and reference log-probs, the update, and the step's logged quantities, by name."""
    t0, cpu0 = time.time(), time.process_time()
    cfg, dist, device, state = run.cfg, run.dist, run.device, run.state
    run.engine.before_update()  # a colocated vLLM engine gives the GPU back for the update
    # A rollout that could not run (an unreachable tool) is out of the group statistics and the loss.
    rollouts, adv = without_failed_runs(run.algo.advantage, batch.rollouts, **run.algo.advantage_options(cfg))
    ran = [r for r in rollouts if failed_to_run(r.info) is None]
    pad_id = run.tokenizer.pad_token_id if run.tokenizer.pad_token_id is not None else 0
    data = pad_rollouts(rollouts, pad_id, {"advantages": adv.advantages, "weights": adv.weights})

    # Old and reference log-probs: the pre-update model, no grad. The first mini-batch is scored
    # before any update, so its own forward gives its old log-probs; only the other rows need
    # this extra pass (none at all with one mini-batch and one epoch).
    first_order = torch.randperm(len(rollouts)).tolist()
    first_rows = set(first_order[: cfg.optim.mini_batch_size])
    rest = [i for i in range(len(rollouts)) if i not in first_rows]
    old_logp = torch.zeros_like(data.mask)
    if rest or run.sharded:  # FSDP: every process takes part in each forward
        old_logp[rest] = upd.score(run.scorer, data, cfg, device, rows=rest, dist=dist)
    ref_logp = None
    if cfg.loss.use_kl:  # the frozen copy, or LoRA's base
        ref_model, scope = reference_scope(run.model, run.reference)
        with scope:
            ref_logp = upd.score(TokenScorer(ref_model), data, cfg, device)

    if checkpointing_on(run.model):
        run.model.train()  # transformers recomputes activations in train mode only
    expected = cfg.prompts_per_step * run.algo.leaves_per_prompt(cfg)
    n_mini = math.ceil(expected / cfg.optim.mini_batch_size)  # as many on every process
    trees = [r.prompt_index * 100_000 + r.tree_index for r in rollouts]  # a tree's leaves, then the prompt's trees
    stats, nonfinite = upd.update(run.updater, data, old_logp, ref_logp, first_order, n_mini, trees)
    packing = _packing(stats)
    run.model.eval()
    run.engine.after_update(run.model)  # new weights into the engine, stale prefix KV dropped
    _count_nonfinite(run, nonfinite)

    state.step += 1
    bud = batch.budget
    counts = {  # summed over processes and logged as they are
        "trajectories": len(rollouts), "generated_tokens": bud.generated_tokens, "prefill_tokens": bud.prefill_tokens,
        "reused_tokens": bud.reused_tokens, "tool_calls": bud.tool_calls, "env_steps": bud.env_steps,
        "trainer_tokens": sum(len(r.token_ids) for r in rollouts), "tool_rounds": bud.tool_rounds,
        "resampled": bud.resampled,
    }
    totals = parallel.all_sum_named({
        **counts, "reward": sum(r.reward for r in ran), "success": sum(success(r.info) for r in ran),
        "ran": len(ran),
        "logprob_gap": upd.logprob_gap(data, old_logp), "action_tokens": sum(data.mask.sum(-1).tolist()),
    }, dist, device)
    state.tokens_total += int(totals["generated_tokens"])
    totals["seconds"] = time.time() - t0 + run.sample_seconds
    for key in CURRENCY_TOTALS:  # running totals in every budget currency, for the held-out curves (log_eval)
        state.extra[key] = state.extra.get(key, 0) + totals[key.removesuffix("_total")]
    n = max(totals["trajectories"], 1.0)
    failed = int(totals["trajectories"] - totals["ran"])
    return {
        "reward": totals["reward"] / max(totals["ran"], 1.0), "success": totals["success"] / max(totals["ran"], 1.0),
        **{k: int(totals[k]) for k in counts}, **({"failed_to_run": failed} if failed else {}),
        "distinct_frac": distinct_share(batch.trees, max(1, cfg.sampler.distinct)),
        "distinct_action_share": distinct_action_share(batch.trees), **adv.stats,
        "distinct_first": distinct_first_moves(batch.trees), "eff_trajectories": effective_trajectories(batch.trees),
        "tokens_total": state.tokens_total, "logprob_gap": totals["logprob_gap"] / dist.world,
        "action_tokens_per_traj": totals["action_tokens"] / n,
        "adv_abs": float(torch.cat(adv.advantages).abs().mean()) if rollouts else 0.0,
        "zero_adv_frac": upd.zero_share(adv.advantages, rollouts),
        "skipped": int(nonfinite), "time_sample": run.sample_seconds, **packing,
        "time_step": totals["seconds"], "cpu_step": time.process_time() - cpu0,
        **{k: sum(v) / len(v) for k, v in stats.items()},
    }


def _packing(stats: dict[str, list[float]]) -> dict[str, float]:
    """The update's token counts, summed over its forwards: distinct (packed) and per-row
    tokens, and their ratio (1.0 without packing, lower the more the rows share)."""
    unique, rows = (sum(stats.pop(key, [])) for key in upd.PACK_COUNTS)
    return {"update_unique_tokens": unique, "update_row_tokens": rows,
            "update_unique_ratio": unique / rows if rows else 1.0}


def _count_nonfinite(run: Run, nonfinite: bool) -> None:
    """A non-finite step is skipped (weights already stepped in it came from finite losses);
    three in a row stop the run."""
    state = run.state
    if not nonfinite:
        state.nonfinite_streak = 0
        return
    run.updater.optimizer.zero_grad(set_to_none=True)
    state.nonfinite_streak += 1
    warnings.warn(f"step {state.step + 1}: non-finite loss, update skipped "
                  f"({state.nonfinite_streak}/{MAX_NONFINITE_STREAK} in a row)", stacklevel=1)
    if state.nonfinite_streak >= MAX_NONFINITE_STREAK:
        raise TrainingError(
            f"the loss was non-finite in {MAX_NONFINITE_STREAK} consecutive steps (last: step "
            f"{state.step + 1}); lower optim.lr, check the rewards for NaN, or resume from "
            f"{run.folder / 'checkpoints'}")
