"""Supervised warm start (SFT) on expert episodes, before RL (why: ``treegym.trainers.recipe``).

``run_sft`` imitates an expert in the RL context format, only the action tokens labelled, and
saves a HF model folder; its steps are ``treegym sft --help``'s (``treegym.trainers.cli_sft``),
its held-out scores every phase's (``treegym.trainers.heldout``).
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from treegym.agents.eval import progress_bar, read_traces
from treegym.agents.experts import ExpertError, make_expert
from treegym.agents.rollout.context import TokenContext, resolve_mode
from treegym.agents.rollout.scoring import HeldOut
from treegym.envs import registry as env_registry
from treegym.errors import ConfigError, TreegymError
from treegym.trainers import parallel
from treegym.trainers.config import SFTConfig, TrainConfig, validate
from treegym.trainers.heldout import evaluate_policy
from treegym.trainers.logprobs import TokenScorer, pad_right
from treegym.trainers.model import load_trainable_model, make_policy
from treegym.trainers.prompts import make_env, sampling_params, train_prompts
from treegym.trainers.sft_data import SFTExample, collect_episodes, select_examples

SFT_META = "sft.json"


class OutputFolderError(TreegymError):
    """The output folder cannot be written."""


@dataclass(frozen=True)
class SFTResult:
    folder: Path
    examples: int
    dropped: dict[str, int]
    label_tokens: int
    steps: int
    loss_first: float
    loss_last: float
    before: HeldOut | None  # greedy, on the held-out prompts
    after: HeldOut | None
    seconds: float


# ---- the loss (pure) --------------------------------------------------------------------------


def pad_examples(examples: Sequence[SFTExample], pad_id: int) -> tuple[torch.Tensor, ...]:
    """Right-padded ``input_ids`` and ``attention_mask``, then per predicted position (shifted
    by one, as ``TokenScorer`` takes them) the target ids and the 0/1 label mask.

    Each example is cut after its last action token: what follows (the final observation)
    has no label and nothing after it does either, so running it would be wasted compute.
    """
    lengths = [_last_label(e) + 1 for e in examples]
    width = max(lengths)
    ids = pad_right([e.token_ids[:n] for e, n in zip(examples, lengths)], width, pad_id, torch.long)
    attn = pad_right([[1] * n for n in lengths], width, 0, torch.long)
    labels = pad_right([e.label_mask[:n] for e, n in zip(examples, lengths)], width)
    return ids, attn, ids[:, 1:], labels[:, 1:]


def _last_label(e: SFTExample) -> int:
    return max((i for i, m in enumerate(e.label_mask) if m), default=len(e.token_ids) - 1)


def batch_nll(scorer: TokenScorer, examples: Sequence[SFTExample], pad_id: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """Summed next-token NLL of the action tokens of ``examples``, and how many there were: the
    RL loss's own log-probs (``TokenScorer``, which runs the LM head on those positions only)."""
    ids, attn, targets, mask = (t.to(device) for t in pad_examples(examples, pad_id))
    logp, _ = scorer(ids, attn, targets, mask, with_entropy=False)
    return -logp.sum(), int(mask.sum())


# ---- training ---------------------------------------------------------------------------------


def train_examples(model: torch.nn.Module, examples: Sequence[SFTExample], cfg: SFTConfig, pad_id: int,
                   device: torch.device, progress: bool = True, seed: int = 0,
                   after_pass: Callable[[int], None] | None = None, bf16: bool = False) -> list[float]:
    """AdamW over ``cfg.epochs`` shuffled passes; returns the loss (per labelled token) of each step.

    A step's loss is the mean over the labelled tokens of its whole batch: micro-batches add
    their summed NLL, divided by the batch's label count, so splitting changes nothing.
    ``bf16``: forward and backward under bf16 autocast, weights and AdamW in fp32, as the RL
    update runs (``parallel.train_bf16``; on these CPUs a household step of 8 episodes, 11,918
    tokens, takes 24.8 s against 56.1 s in fp32: 2.26x, ``benchmarks/bench_sft_step.py``).
    ``after_pass(k)`` is called after pass ``k`` (1-based) with the model in eval mode (a
    learning curve over passes from one run: ``benchmarks/tune_warm_start.py --each-pass``).
    """
    if not examples:
        raise ConfigError("no examples to train on")
    params = [p for p in model.parameters() if p.requires_grad]
    scorer = TokenScorer(model)
    optimizer = parallel.adamw(params, cfg.lr, cfg.weight_decay)
    total_steps = math.ceil(len(examples) / cfg.batch_size) * cfg.epochs
    warmup = int(cfg.warmup * total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, warmup, total_steps))
    rng = random.Random(seed)
    losses: list[float] = []
    bar = progress_bar(total_steps, "sft", progress, "step")
    model.train()
    try:
        for epoch in range(cfg.epochs):
            order = list(range(len(examples)))
            rng.shuffle(order)
            for start in range(0, len(order), cfg.batch_size):
                # Longest first, so that each micro-batch pads to neighbours of similar length.
                batch = sorted((examples[i] for i in order[start : start + cfg.batch_size]), key=lambda e: -len(e.token_ids))
                n_labels = max(1, sum(e.n_labels for e in batch))
                optimizer.zero_grad(set_to_none=True)
                step_loss = 0.0
                for m in range(0, len(batch), cfg.micro_batch_size):
                    with parallel.autocast(device, bf16):
                        nll, _ = batch_nll(scorer, batch[m : m + cfg.micro_batch_size], pad_id, device)
                    (nll / n_labels).backward()
                    step_loss += nll.item() / n_labels
                torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
                optimizer.step()
                scheduler.step()
                losses.append(step_loss)
                bar.update(1)
                bar.set_postfix(loss=f"{step_loss:.3f}")
            if after_pass is not None:
                model.eval()
                after_pass(epoch + 1)
                model.train()
    finally:
        bar.close()
        model.eval()
    return losses


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warm-up to 1 over ``warmup`` steps, then linear decay towards 0 at ``total``."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    return max(0.0, (total - step) / max(1, total - warmup))


# ---- saving -----------------------------------------------------------------------------------


def check_writable(out: str | Path) -> Path:
    """Create ``out`` (if needed) and prove it can be written, before any training time is spent."""
    folder = Path(out).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise OutputFolderError(f"cannot write the output folder {folder}: {exc.strerror or exc}; pass --out DIR") from None
    return folder


def save_model(model: torch.nn.Module, tokenizer: Any, folder: Path, meta: dict[str, Any]) -> Path:
    """A plain HF folder: safetensors weights (LoRA merged in), tokenizer, and ``sft.json``."""
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    try:
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)
        (folder / SFT_META).write_text(json.dumps(meta, indent=2, default=str) + "\n", encoding="utf-8")
    except OSError as exc:
        raise OutputFolderError(f"cannot save the model to {folder}: {exc}") from None
    return folder


# ---- the whole job ----------------------------------------------------------------------------


def run_sft(cfg: TrainConfig, progress: bool = True, log: Any = print, meta: dict[str, Any] | None = None,
            after_pass: Callable[[int, torch.nn.Module, Any], None] | None = None) -> SFTResult:
    """Collect (or read) expert episodes, train, save (``meta`` added to its sft.json), and score
    before and after (see module doc). ``after_pass(k, model, tokenizer)`` runs after each pass.

    ``cfg.sft`` says how to imitate; the rest of ``cfg`` is the run the model is for: its env and
    training variant, turn budget and length (``sampler``), splits and held-out prompts (``run``),
    device and LoRA (``model_opts``)."""
    t0 = time.perf_counter()
    validate(cfg)
    sft, s = cfg.sft, cfg.sampler
    folder = check_writable(sft.out)
    parallel.seed_everything(cfg.seed)
    # Episodes before the model: a bad trace file or expert fails in a second, not after a load.
    if sft.traces:
        episodes = read_traces(sft.traces)
        source = f"traces {sft.traces}"
    else:
        name = expert_name(cfg)
        expert = make_expert(cfg.env, name, s.max_turns)
        env = make_env(cfg, cfg.run.train_split)
        prompts = train_prompts(env_registry.task_ids(env), cfg.seed, 0, sft.episodes)
        episodes = collect_episodes(env, expert, prompts, progress, max_turns=s.max_turns)
        source = f"{name} expert on {cfg.env} ({cfg.run.train_split})"

    device = parallel.pick_device(cfg.model_opts.device)
    model, tokenizer = load_trainable_model(cfg, device)  # as RL loads it: LoRA (zero at first), checkpointing
    mode = resolve_mode(s.context_mode, tokenizer)
    ctx = TokenContext(tokenizer, mode)  # type: ignore[arg-type]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    params = sampling_params(cfg).with_stops(env_registry.family(cfg.env).action_stops)  # how its turns end
    examples, dropped = select_examples(ctx, episodes, not sft.keep_wrong, params)
    if not examples:
        raise ConfigError(f"none of the {len(episodes)} expert episodes is usable (dropped: {dropped})")
    log(f"sft: {len(examples)} episodes from {source}, dropped {dropped}; "
        f"{sum(e.n_labels for e in examples):,} action tokens of {sum(len(e.token_ids) for e in examples):,}")

    eval_env = make_env(cfg, cfg.run.eval_split) if cfg.run.eval_n else None

    def score(phase: str) -> HeldOut | None:  # greedy, by a fresh policy over the current weights
        got = evaluate_policy(make_policy(model, tokenizer, seed=cfg.seed, bf16=parallel.decode_bf16(device, cfg.model_opts)),
                              eval_env, cfg, device, temperature=0.0)
        if got is not None:
            log(f"sft: {phase}: success {got.success_rate:.3f}, well-formed actions {got.mean('well_formed'):.3f} "
                f"({got.n} {cfg.run.eval_split} prompts)")
        return got

    before = score("before")
    t_train = time.perf_counter()
    each = None if after_pass is None else (lambda k: after_pass(k, model, tokenizer))
    losses = train_examples(model, examples, sft, pad_id, device, progress, cfg.seed, after_pass=each,
                            bf16=parallel.train_bf16(device, cfg.model_opts))
    log(f"sft: {len(losses)} steps in {time.perf_counter() - t_train:.0f} s, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    after = score("after")
    saved = {"source": source, "base_model": cfg.model, "context_mode": mode, "examples": len(examples),
             "dropped": dropped, "episode_ids": [e.episode_id for e in examples], "losses": losses,
             "before": before.to_dict() if before else None, "after": after.to_dict() if after else None,
             "config": asdict(cfg), **(meta or {})}
    save_model(model, tokenizer, folder, saved)
    return SFTResult(folder, len(examples), dropped, sum(e.n_labels for e in examples), len(losses),
                     losses[0], losses[-1], before, after, time.perf_counter() - t0)


def expert_name(cfg: TrainConfig) -> str:
    """The expert ``cfg.sft.expert`` names: ``auto`` is the env family's (``Family.expert``)."""
    if cfg.sft.expert != "auto":
        return cfg.sft.expert
    fam = env_registry.family(cfg.env)
    if fam.expert is None:
        raise ExpertError(f"env {cfg.env!r} has no scripted expert; pass --traces from `treegym eval --out DIR`")
    return fam.expert
