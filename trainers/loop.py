"""The training loop shared by every algorithm. Reads top to bottom.

Each step: sample prompts -> roll out with the algorithm's sampler -> rewards -> advantages
-> old (and reference) log-probs with the pre-update model -> ``ppo_epochs`` x mini-batches,
each accumulated over micro-batches, clipped, stepped -> log -> checkpoint.

Log-probs: the loss scores rollout tokens with the HF model itself at temperature 1. The
"old" log-probs of the ratio are recomputed with the same code path on the pre-update
weights (one no-grad forward per chunk), rather than taken from the sampler, so that the
ratio is exactly 1 before the first update whatever the sampling temperature, top-p or
kernel differences between generation and scoring. The sampler's behaviour log-probs are
kept for a diagnostic (``logprob_gap``: how far the scorer is from what the sampler saw).

Runs under ``torchrun`` as data-parallel replicas (DDP); every process samples its own
prompts and the gradients are averaged.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from treegym.agents.policy import SamplingParams
from treegym.agents.rollout.context import resolve_mode
from treegym.agents.rollout.samplers import sample_chains, sample_trees
from treegym.agents.rollout.types import Rollout, RolloutBatch
from treegym.errors import TreegymError
from treegym.trainers import runtime as rt
from treegym.trainers.advantages import get_advantage
from treegym.trainers.algorithms import advantage_kwargs, get_algorithm, leaves_per_prompt, loss_kwargs
from treegym.trainers.checkpoint import (
    TrainState,
    load_latest_checkpoint,
    rng_state,
    save_checkpoint,
    save_policy,
)
from treegym.trainers.config import TrainConfig, to_dict
from treegym.trainers.heldout import HeldOut, evaluate_policy, success_of
from treegym.trainers.logprobs import PaddedBatch, TokenScorer, pad_rollouts
from treegym.trainers.losses import aggregate, get_policy_loss, kl_k3
from treegym.trainers.run_folder import open_run_folder, remove_if_unused
from treegym.trainers.runlog import RunLog, plot_metrics

MAX_NONFINITE_STREAK = 3


class TrainingError(TreegymError):
    """Training cannot go on (e.g. the loss stayed non-finite)."""


@dataclass
class RunResult:
    folder: Path
    steps: int
    em_before: float | None
    em_after: float | None
    tokens_total: int
    seconds: float
    history: list[dict[str, Any]] = field(default_factory=list)
    replica_digests: list[str] = field(default_factory=list)
    eval_before: HeldOut | None = None  # per held-out prompt, before the first step
    eval_after: HeldOut | None = None


def train(cfg: TrainConfig, *, progress: bool = True) -> RunResult:
    """Run (or resume) the training described by ``cfg``; returns the run's summary."""
    t_start = time.time()
    rt.preflight(cfg)
    dist, device = rt.setup_distributed(cfg.model_opts.device)
    folder: Path | None = None
    try:
        folder = _open_folder(cfg, dist)
        return _train(cfg, folder, dist, device, progress, t_start)
    except BaseException:
        if folder is not None and dist.main:
            remove_if_unused(folder)  # a failed run leaves no empty run folder behind
        raise
    finally:
        rt.teardown_distributed()


def _open_folder(cfg: TrainConfig, dist: rt.Dist) -> Path:
    """The main process opens the run folder; every process gets it, or the same error."""
    got: Path | TreegymError | None = None
    if dist.main:
        try:
            got = open_run_folder(cfg, time.strftime("%Y%m%d-%H%M%S"))
        except TreegymError as exc:
            got = exc
    got = rt.broadcast_object(got, dist)
    if isinstance(got, TreegymError):
        raise got
    assert got is not None
    return got


def _train(cfg: TrainConfig, folder: Path, dist: rt.Dist, device: torch.device, progress: bool,
           t_start: float) -> RunResult:
    algo = get_algorithm(cfg.algo)
    rt.seed_everything(cfg.seed * 1000 + dist.rank)

    # ---- model, optimiser, envs --------------------------------------------------------------
    model, tokenizer = rt.load_trainable_model(cfg, device)
    scorer = TokenScorer(model)
    trainer = DistributedDataParallel(scorer) if dist.on else scorer
    reference = rt.frozen_copy(model) if cfg.loss.use_kl else None
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
    policy = rt.make_policy(model, tokenizer, seed=cfg.seed * 1000 + dist.rank)
    generators = rt.policy_generators(policy)
    env = rt.make_env(cfg, cfg.run.train_split)
    eval_env = rt.make_env(cfg, cfg.run.eval_split) if cfg.run.eval_n else None
    ids = rt.task_ids(env)
    mode = resolve_mode(cfg.sampler.context_mode, tokenizer)
    sampling = SamplingParams(temperature=cfg.sampler.temperature, top_p=cfg.sampler.top_p,
                              max_new_tokens=cfg.sampler.max_new_tokens, ignore_eos=cfg.sampler.ignore_eos)
    advantage_fn, adv_kwargs = get_advantage(algo.advantage), advantage_kwargs(algo, cfg)
    loss_fn, l_kwargs = get_policy_loss(algo.loss), loss_kwargs(algo, cfg)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def rollout(env_: Any, prompts: list[Any], step_seed: int) -> RolloutBatch:
        common = {"max_turns": cfg.sampler.max_turns, "mode": mode, "max_context_tokens": cfg.sampler.max_context_tokens}
        with torch.no_grad(), rt.autocast(device, cfg.model_opts.bf16):
            if algo.sampler == "chains":
                return sample_chains(policy, env_, prompts, cfg.sampler.group_size, sampling, **common)
            s = cfg.sampler
            return sample_trees(policy, env_, prompts, m=s.trees, n=s.expand_nodes, l=s.rounds, k=s.leaves,
                                params=sampling, expansion=s.expansion, seed=step_seed, **common)

    def evaluate_heldout(temperature: float = cfg.run.eval_temperature) -> HeldOut | None:
        """One chain per held-out prompt (this process's share), gathered in rank order."""
        if eval_env is None:
            return None
        prompts = rt.eval_prompts(rt.task_ids(eval_env), cfg.run.eval_n)[dist.rank :: dist.world]
        with torch.no_grad(), rt.autocast(device, cfg.model_opts.bf16):
            local = evaluate_policy(policy, eval_env, prompts, cfg, mode, temperature)
        return HeldOut.merge(rt.gather_objects(local, dist))

    def evaluate(temperature: float = cfg.run.eval_temperature) -> float | None:
        got = evaluate_heldout(temperature)
        return None if got is None else got.em_rate

    def log_eval(step: int, em: float | None) -> None:
        """Log held-out EM (and, with run.eval_sampled, EM at temperature 1 as eval_em_t1)."""
        if em is None:
            return
        row = {"eval_em": em, "tokens_total": state.tokens_total}
        if cfg.run.eval_sampled:
            row["eval_em_t1"] = evaluate(1.0)
        if log is not None:
            log.log(step, row)

    # ---- resume ------------------------------------------------------------------------------
    state = TrainState()
    loaded = load_latest_checkpoint(folder / "checkpoints", model, optimizer, dist.rank, generators) if cfg.run.resume else None
    if loaded is not None:
        state, path = loaded
        policy.clear_cache()
        if dist.main:
            print(f"resumed from {path} (step {state.step})")
    log = RunLog(folder, tensorboard=cfg.run.tensorboard and dist.main, wandb=cfg.run.wandb and dist.main,
                 config=to_dict(cfg), resume_step=state.step) if dist.main else None
    if "em_before" not in state.extra:
        before = evaluate_heldout()
        state.extra["em_before"] = None if before is None else before.em_rate
        state.extra["eval_before"] = None if before is None else before.to_dict()
        log_eval(0, state.extra["em_before"])

    # ---- the loop ----------------------------------------------------------------------------
    bar = tqdm(total=cfg.steps, initial=state.step, desc=f"{cfg.algo} on {cfg.env}", disable=not (progress and dist.main))
    expected = cfg.prompts_per_step * leaves_per_prompt(algo, cfg)
    n_mini = max(1, math.ceil(expected / cfg.optim.mini_batch_size))
    n_micro = max(1, math.ceil(cfg.optim.mini_batch_size / cfg.optim.micro_batch_size))
    last_batch: RolloutBatch | None = None
    while state.step < cfg.steps and not _budget_spent(cfg, state):
        t0, cpu0 = time.time(), time.process_time()
        # 1. prompts: this process's slice of the global stream
        start = state.data_position + dist.rank * cfg.prompts_per_step
        prompts = rt.train_prompts(ids, cfg.seed, start, cfg.prompts_per_step)
        state.data_position += cfg.prompts_per_step * dist.world

        # 2-3. roll out; the sampler's leaves carry their rewards
        model.eval()
        batch = rollout(env, prompts, cfg.seed * 100_003 + state.step * dist.world + dist.rank)
        rollouts = batch.rollouts
        t_sample = time.time() - t0

        # 4. advantages, per action token
        adv = advantage_fn(rollouts, **adv_kwargs)
        data = pad_rollouts(rollouts, pad_id, {"advantages": adv.advantages, "weights": adv.weights})

        # 5a. old and reference log-probs: the pre-update model, no grad. The first mini-batch
        # is scored before any update, so its own forward gives its old log-probs; only the
        # other rows need this extra pass (none at all with one mini-batch and one epoch).
        first_order = torch.randperm(len(rollouts)).tolist()
        first_rows = set(first_order[: cfg.optim.mini_batch_size])
        rest = [i for i in range(len(rollouts)) if i not in first_rows]
        old_logp = torch.zeros_like(data.mask)
        if rest:
            old_logp[rest] = _score(scorer, data, cfg, device, with_entropy=False, rows=rest)
        ref_logp = None
        if reference is not None or (cfg.loss.use_kl and hasattr(model, "disable_adapter")):
            ref_model, scope = rt.reference_scope(model, reference)
            with scope:
                ref_logp = _score(TokenScorer(ref_model), data, cfg, device, with_entropy=False)

        # 5b. ppo_epochs x mini-batches x micro-batches. Non-finite inputs skip the whole step
        # before any update; a non-finite loss or gradient met later skips the rest of it.
        if cfg.model_opts.gradient_checkpointing:
            model.train()
        stats: dict[str, list[float]] = {}
        bad_inputs = not (torch.isfinite(old_logp).all() and torch.isfinite(data.extras["advantages"]).all())
        fresh = True  # no update yet in this step: the current forward is the old policy
        nonfinite = rt.any_rank(bool(bad_inputs), dist, device)
        epochs = 0 if nonfinite else cfg.optim.ppo_epochs
        for epoch in range(epochs):
            order = first_order if epoch == 0 else torch.randperm(len(rollouts)).tolist()
            for m in range(n_mini):
                mb = order[m * cfg.optim.mini_batch_size : (m + 1) * cfg.optim.mini_batch_size]
                norm = _normaliser(data, mb, cfg.loss.agg)
                optimizer.zero_grad(set_to_none=True)
                for u in range(n_micro):
                    micro = mb[u * cfg.optim.micro_batch_size : (u + 1) * cfg.optim.micro_batch_size]
                    # Every process runs the same number of forward/backward passes (DDP
                    # reduces gradients in lock-step); an empty micro-batch scores row 0 x 0.
                    rows, scale = (micro, 1.0) if micro else ([0], 0.0)
                    sync = u == n_micro - 1
                    ctx = trainer.no_sync() if (dist.on and not sync) else contextlib.nullcontext()
                    with ctx, rt.autocast(device, cfg.model_opts.bf16):
                        ids_, attn, tgt, mask, n = _take(data, rows, device)
                        logp, entropy = trainer(ids_, attn, tgt, mask, with_entropy=True)
                        if fresh and micro:
                            old_logp[micro, :n] = logp.detach().float().cpu()
                        a = data.extras["advantages"][rows, :n].to(device)
                        w = data.extras["weights"][rows, :n].to(device)
                        out = loss_fn(logp, old_logp[rows, :n].to(device), a, mask, weights=w, **l_kwargs)
                        loss = out.loss - cfg.loss.entropy_coef * aggregate(entropy, mask, cfg.loss.agg, cfg.loss.constant_normalizer)
                        if ref_logp is not None:
                            kl = aggregate(kl_k3(logp, ref_logp[rows, :n].to(device)), mask, cfg.loss.agg, cfg.loss.constant_normalizer)
                            loss = loss + cfg.loss.kl_coef * kl
                            _add(stats, "kl_ref", kl.item())
                        loss = loss * scale * _micro_share(data, micro, norm, cfg.loss.agg)
                    if rt.any_rank(not torch.isfinite(loss).item(), dist, device):
                        nonfinite = True
                        break
                    loss.backward()
                    if micro:
                        for key in ("pg_loss", "pg_loss1", "pg_loss2", "approx_kl", "clipfrac", "ratio_mean", "pg_weight"):
                            _add(stats, key, getattr(out, key).item())
                        _add(stats, "entropy", (entropy * mask).sum().item() / max(mask.sum().item(), 1.0))
                if nonfinite:
                    break
                grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.optim.max_grad_norm)
                if rt.any_rank(not math.isfinite(float(grad_norm)), dist, device):
                    nonfinite = True
                    break
                _add(stats, "grad_norm", float(grad_norm))
                # A mini-batch whose advantages are all 0 has an exactly-zero gradient (on every
                # rank: it is reduced). AdamW would still move every weight by about lr on its
                # stale momentum, and with a sparse reward most steps are such steps.
                if cfg.optim.skip_empty_steps and float(grad_norm) == 0.0:
                    _add(stats, "empty_steps", 1.0)
                    continue
                _add(stats, "empty_steps", 0.0)
                optimizer.step()
                fresh = False
            if nonfinite:
                break
        model.eval()
        policy.clear_cache()  # its stored prefix KV came from the old weights

        # non-finite loss: the step is skipped (weights already stepped this step are kept:
        # they came from finite losses); three in a row stop the run
        if nonfinite:
            optimizer.zero_grad(set_to_none=True)
            state.nonfinite_streak += 1
            warnings.warn(f"step {state.step + 1}: non-finite loss, update skipped "
                          f"({state.nonfinite_streak}/{MAX_NONFINITE_STREAK} in a row)", stacklevel=1)
            if state.nonfinite_streak >= MAX_NONFINITE_STREAK:
                raise TrainingError(
                    f"the loss was non-finite in {MAX_NONFINITE_STREAK} consecutive steps (last: step "
                    f"{state.step + 1}); lower optim.lr, check the rewards for NaN, or resume from "
                    f"{folder / 'checkpoints'}")
        else:
            state.nonfinite_streak = 0

        # 6. log
        state.step += 1
        bud = batch.budget
        totals = rt.all_sum([sum(r.reward for r in rollouts), sum(success_of(r.info, r.reward) for r in rollouts), len(rollouts),
                             bud.generated_tokens, bud.prefill_tokens, bud.reused_tokens, bud.tool_calls,
                             bud.env_steps, _logprob_gap(data, old_logp), sum(data.mask.sum(-1).tolist())],
                            dist, device)
        state.tokens_total += int(totals[3])
        n = max(totals[2], 1.0)
        metrics = {
            "reward": totals[0] / n, "em": totals[1] / n, "trajectories": int(totals[2]),
            "generated_tokens": int(totals[3]), "prefill_tokens": int(totals[4]), "reused_tokens": int(totals[5]),
            "tool_calls": int(totals[6]), "env_steps": int(totals[7]), "tokens_total": state.tokens_total,
            "logprob_gap": totals[8] / dist.world, "action_tokens_per_traj": totals[9] / n,
            "adv_abs": float(torch.cat(adv.advantages).abs().mean()) if rollouts else 0.0,
            "zero_adv_frac": _zero_share(adv.advantages, rollouts),
            "skipped": int(nonfinite), "time_sample": t_sample, "time_step": time.time() - t0, "cpu_step": time.process_time() - cpu0,
            **{k: sum(v) / len(v) for k, v in stats.items()},
        }
        if log is not None and state.step % cfg.run.log_every == 0:
            log.log(state.step, metrics)
        bar.update(1)
        bar.set_postfix(reward=f"{metrics['reward']:.3f}", kl=f"{metrics.get('approx_kl', 0):.4f}",
                        tokens=state.tokens_total)
        last_batch = batch

        # 7. held-out EM now and then; checkpoint (every process contributes its RNG stream)
        finished = state.step >= cfg.steps or _budget_spent(cfg, state)
        if cfg.run.eval_every and state.step % cfg.run.eval_every == 0 and not finished:
            log_eval(state.step, evaluate())
        if (cfg.run.save_every and state.step % cfg.run.save_every == 0) or finished:
            rngs = rt.gather_objects(rng_state(generators), dist)
            if dist.main:
                save_checkpoint(folder / "checkpoints", model, optimizer, state, rngs)
    bar.close()
    if dist.main:
        save_policy(model, tokenizer, folder / "final")

    # ---- after training: EM after, plots, trees, summary ------------------------------------
    after = evaluate_heldout()
    em_after = None if after is None else after.em_rate
    log_eval(state.step, em_after)
    digests = rt.gather_objects(rt.weights_digest(model), dist)
    history: list[dict[str, Any]] = []
    if log is not None:
        log.close()
        from treegym.trainers.runlog import read_metrics

        history = read_metrics(folder / "metrics.jsonl")
        if cfg.run.plots:
            plot_metrics(folder)
        if cfg.run.trees_html and last_batch is not None:
            _write_trees(last_batch, tokenizer, folder / "trees.html", f"{cfg.algo}: rollout trees of step {state.step}")
    before_data = state.extra.get("eval_before")
    result = RunResult(folder, state.step, state.extra["em_before"], em_after, state.tokens_total,
                       time.time() - t_start, history, digests,
                       HeldOut.from_dict(before_data) if before_data else None, after)
    if dist.main:
        summary = {k: v.to_dict() if isinstance(v, HeldOut) else v for k, v in result.__dict__.items() if k != "history"}
        (folder / "summary.json").write_text(json.dumps({**summary, "folder": str(folder), "world": dist.world}, indent=2))
    if len(set(digests)) > 1:
        raise TrainingError(f"data-parallel replicas diverged: weight digests {digests}")
    return result


# ---- helpers (pure or local) ------------------------------------------------------------------


def _budget_spent(cfg: TrainConfig, state: TrainState) -> bool:
    return bool(cfg.token_budget) and state.tokens_total >= cfg.token_budget


def _zero_share(advantages: list[torch.Tensor], rollouts: list[Rollout]) -> float:
    """Share of action tokens whose advantage is exactly 0 (they carry no learning signal)."""
    masks = [torch.tensor(r.loss_mask, dtype=torch.bool) for r in rollouts]
    total = sum(int(m.sum()) for m in masks)
    zero = sum(int(((a == 0) & m).sum()) for a, m in zip(advantages, masks))
    return zero / total if total else 0.0


def _add(stats: dict[str, list[float]], key: str, value: float) -> None:
    stats.setdefault(key, []).append(value)


def _score(scorer: TokenScorer, data: PaddedBatch, cfg: TrainConfig, device: torch.device, *,
           with_entropy: bool, rows: list[int] | None = None) -> torch.Tensor:
    """Log-probs of ``rows`` (default: every rollout) under the current weights, without grad."""
    every = list(range(len(data.input_ids))) if rows is None else rows
    out = torch.zeros((len(every), data.mask.shape[1]))
    with torch.no_grad(), rt.autocast(device, cfg.model_opts.bf16):
        for start in range(0, len(every), cfg.optim.micro_batch_size):
            chunk = every[start : start + cfg.optim.micro_batch_size]
            ids_, attn, tgt, mask, n = _take(data, chunk, device)
            logp, _ = scorer(ids_, attn, tgt, mask, with_entropy=with_entropy)
            out[start : start + len(chunk), :n] = logp.float().cpu()
    return out


def _take(data: PaddedBatch, rows: list[int], device: torch.device) -> tuple[torch.Tensor, ...] | Any:
    """The model inputs of ``rows``, trimmed to their own longest rollout; and the target width."""
    width = int(data.attention_mask[rows].sum(-1).max())
    n = width - 1
    return (data.input_ids[rows, :width].to(device), data.attention_mask[rows, :width].to(device),
            data.targets[rows, :n].to(device), data.mask[rows, :n].to(device), n)


def _normaliser(data: PaddedBatch, rows: list[int], agg: str) -> float:
    """The mini-batch's token count (token-mean) or sequence count (seq-mean)."""
    if not rows:
        return 1.0
    if agg == "token-mean":
        return max(float(data.mask[rows].sum()), 1.0)
    if agg == "seq-mean":
        return max(float((data.mask[rows].sum(-1) > 0).sum()), 1.0)
    return 1.0


def _micro_share(data: PaddedBatch, rows: list[int], norm: float, agg: str) -> float:
    """Scale a micro-batch's own mean so that the accumulated sum is the mini-batch's mean."""
    if not rows or agg == "constant":
        return 1.0
    if agg == "token-mean":
        return float(data.mask[rows].sum()) / norm
    return float((data.mask[rows].sum(-1) > 0).sum()) / norm


def _logprob_gap(data: PaddedBatch, logp: torch.Tensor) -> float:
    """Mean |scorer - sampler| log-prob on action tokens (meaningful at temperature 1, top-p 1)."""
    m = data.mask
    return float(((logp - data.behaviour_logprobs).abs() * m).sum() / m.sum().clamp(min=1.0))


def _write_trees(batch: RolloutBatch, tokenizer: Any, path: Path, title: str) -> None:
    from treegym.agents.tree_html import write_tree_html

    try:
        write_tree_html(path, batch.trees, tokenizer, title=title)
    except Exception as exc:  # a view is a convenience: never lose a finished run over it
        warnings.warn(f"could not write {path}: {exc}", stacklevel=1)
