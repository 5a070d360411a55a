"""Supervised warm start (SFT) on expert episodes, before RL.

A small instruct model rarely emits a well-formed ``<search>``/``<answer>`` turn on its own,
so every RL reward is 0 and every advantage with it. ``run_sft`` fixes the format first:

1. expert episodes: a scripted expert run through the training env, with the env family's turn
   budget and length (``treegym.trainers.sft_data``), or traces written by ``treegym eval --out``;
2. each episode in the RL context format, only its action tokens labelled;
3. AdamW on the masked next-token loss (all weights, or LoRA adapters merged at the end);
4. a HF model folder (safetensors, tokenizer, ``sft.json``) that ``treegym train --model`` and
   ``treegym eval --agent`` load like any local model;
5. EM and the rate of well-formed actions on held-out prompts, greedy, before and after.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from treegym.agents.rollout.context import TokenContext, resolve_mode
from treegym.envs.core import success
from treegym.errors import ConfigError, TreegymError
from treegym.trainers.config import SFTConfig, TrainConfig, to_dict, validate
from treegym.trainers.sft_data import SFTExample, collect_episodes, make_expert, read_traces, select_examples

SFT_META = "sft.json"


class OutputFolderError(TreegymError):
    """The output folder cannot be written."""


@dataclass(frozen=True)
class FormatScore:
    """Greedy results on held-out prompts: EM, and the share of actions the env could parse."""

    n: int
    em: float
    well_formed: float
    actions: int


@dataclass(frozen=True)
class SFTResult:
    folder: Path
    examples: int
    dropped: dict[str, int]
    label_tokens: int
    steps: int
    loss_first: float
    loss_last: float
    before: FormatScore | None
    after: FormatScore | None
    seconds: float


# ---- the loss (pure) --------------------------------------------------------------------------


def pad_examples(examples: Sequence[SFTExample], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (-100 where not trained).

    Each example is cut after its last action token: what follows (the final observation)
    has no label and nothing after it does either, so running it would be wasted compute.
    """
    lengths = [_last_label(e) + 1 for e in examples]
    width = max(lengths)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(examples), width), dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    for row, (e, n) in enumerate(zip(examples, lengths)):
        t = torch.tensor(e.token_ids[:n], dtype=torch.long)
        ids[row, :n] = t
        attn[row, :n] = 1
        labels[row, :n] = torch.where(torch.tensor(e.label_mask[:n], dtype=torch.bool), t, torch.tensor(-100))
    return ids, attn, labels


def _last_label(e: SFTExample) -> int:
    return max((i for i, m in enumerate(e.label_mask) if m), default=len(e.token_ids) - 1)


def masked_nll(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Summed next-token NLL over labelled positions, and how many there were.

    ``logits[:, t]`` predicts token ``t + 1``; positions labelled -100 do not count.
    """
    pred = logits[:, :-1].float()
    target = labels[:, 1:]
    total = torch.nn.functional.cross_entropy(pred.reshape(-1, pred.size(-1)), target.reshape(-1),
                                              ignore_index=-100, reduction="sum")
    return total, int((target != -100).sum())


def batch_nll(model: torch.nn.Module, ids: torch.Tensor, attn: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``masked_nll`` of a batch, projecting only the labelled positions through the LM head.

    Actions are about a tenth of an episode's tokens, and the head (vocabulary x hidden) is a
    large share of a small model's compute; models without a separate decoder and head (or
    with a logit transform after it) get the full logits instead.
    """
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    plain_head = getattr(model.config, "final_logit_softcapping", None) is None and not getattr(model.config, "logit_scale", None)
    if decoder is None or head is None or not plain_head:
        return masked_nll(model(input_ids=ids, attention_mask=attn).logits, labels)
    hidden = decoder(input_ids=ids, attention_mask=attn).last_hidden_state
    target = labels[:, 1:]
    keep = target != -100
    logits = head(hidden[:, :-1][keep]).float()
    total = torch.nn.functional.cross_entropy(logits, target[keep], reduction="sum")
    return total, int(keep.sum())


def example_loss(model: torch.nn.Module, examples: Sequence[SFTExample], pad_id: int, device: torch.device) -> float:
    """Mean NLL per labelled token of ``examples`` (no grad)."""
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(examples), 4):
            ids, attn, labels = (t.to(device) for t in pad_examples(examples[i : i + 4], pad_id))
            s, n = batch_nll(model, ids, attn, labels)
            total, count = total + float(s), count + n
    return total / max(count, 1)


# ---- training ---------------------------------------------------------------------------------


def train_examples(model: torch.nn.Module, examples: Sequence[SFTExample], cfg: SFTConfig, pad_id: int,
                   device: torch.device, progress: bool = True, seed: int = 0) -> list[float]:
    """AdamW over ``cfg.epochs`` shuffled passes; returns the loss (per labelled token) of each step.

    A step's loss is the mean over the labelled tokens of its whole batch: micro-batches add
    their summed NLL, divided by the batch's label count, so splitting changes nothing.
    """
    if not examples:
        raise ConfigError("no examples to train on")
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps_per_epoch = math.ceil(len(examples) / cfg.batch_size)
    total_steps = steps_per_epoch * cfg.epochs
    warmup = int(cfg.warmup * total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, warmup, total_steps))
    rng = random.Random(seed)
    losses: list[float] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total_steps, desc="sft", unit="step")
    model.train()
    try:
        for _ in range(cfg.epochs):
            order = list(range(len(examples)))
            rng.shuffle(order)
            for start in range(0, len(order), cfg.batch_size):
                # Longest first, so that each micro-batch pads to neighbours of similar length.
                batch = sorted((examples[i] for i in order[start : start + cfg.batch_size]), key=lambda e: -len(e.token_ids))
                n_labels = max(1, sum(e.n_labels for e in batch))
                optimizer.zero_grad(set_to_none=True)
                step_loss = 0.0
                for m in range(0, len(batch), cfg.micro_batch_size):
                    ids, attn, labels = (t.to(device) for t in pad_examples(batch[m : m + cfg.micro_batch_size], pad_id))
                    nll, _ = batch_nll(model, ids, attn, labels)
                    (nll / n_labels).backward()
                    step_loss += nll.item() / n_labels
                torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
                optimizer.step()
                scheduler.step()
                losses.append(step_loss)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{step_loss:.3f}")
    finally:
        if bar is not None:
            bar.close()
        model.eval()
    return losses


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warm-up to 1 over ``warmup`` steps, then linear decay towards 0 at ``total``."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    return max(0.0, (total - step) / max(1, total - warmup))


# ---- held-out format and EM -------------------------------------------------------------------


def well_formed_rate(model: torch.nn.Module, tokenizer: Any, env: Any, prompts: Sequence[Any], mode: str,
                 max_turns: int, max_new_tokens: int, seed: int = 0) -> FormatScore:
    """Greedy chains on ``prompts``: success (EM on QA) per episode, and the share of well-formed actions."""
    return format_score(greedy_chains(model, tokenizer, env, prompts, mode, max_turns, max_new_tokens, seed))


def greedy_chains(model: torch.nn.Module, tokenizer: Any, env: Any, prompts: Sequence[Any], mode: str,
                  max_turns: int, max_new_tokens: int, seed: int = 0) -> Any:
    """One greedy chain per prompt (a ``RolloutBatch``), as the held-out scores play them."""
    from treegym.agents.hf_policy import HFPolicy
    from treegym.agents.policy import SamplingParams
    from treegym.agents.rollout.samplers import sample_chains

    policy = HFPolicy(model, tokenizer, seed=seed)
    params = SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=max_new_tokens)
    with torch.no_grad():
        return sample_chains(policy, env, list(prompts), 1, params, max_turns=max_turns, mode=mode)  # type: ignore[arg-type]


def format_score(batch: Any) -> FormatScore:
    """Success per episode and the share of well-formed actions of a batch of chains."""
    turns = [n.turn for tree in batch.trees for n in tree.nodes if n.turn is not None]
    em = [success(r.info) for r in batch.rollouts]
    good = sum(not t.invalid for t in turns)
    return FormatScore(len(em), sum(em) / max(1, len(em)), good / max(1, len(turns)), len(turns))


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


def run_sft(cfg: TrainConfig, progress: bool = True, log: Any = print) -> SFTResult:
    """Collect (or read) expert episodes, train, save, and score before and after (see module doc).

    ``cfg.sft`` says how to imitate; the rest of ``cfg`` is the run the model is for: its env and
    training variant, turn budget and length (``sampler``), splits and held-out prompts (``run``),
    device and LoRA (``model_opts``)."""
    from treegym.envs import registry as env_registry
    from treegym.trainers import runtime as rt
    from treegym.trainers.recipe import device_of

    t0 = time.perf_counter()
    validate(cfg)
    sft, s = cfg.sft, cfg.sampler
    folder = check_writable(sft.out)
    rt.seed_everything(cfg.seed)
    # Episodes before the model: a bad trace file or expert fails in a second, not after a load.
    if sft.traces:
        episodes = read_traces(sft.traces)
        source = f"traces {sft.traces}"
    else:
        name = expert_name(cfg)
        expert = make_expert(name, cfg.env, s.max_turns)
        env = rt.make_env(cfg, cfg.run.train_split)
        prompts = rt.train_prompts(env_registry.task_ids(env), cfg.seed, 0, sft.episodes)
        episodes = collect_episodes(env, expert, prompts, progress, max_turns=s.max_turns)
        source = f"{name} expert on {cfg.env} ({cfg.run.train_split})"

    from treegym.agents.models import load_model

    device = torch.device(device_of(cfg))
    model, tokenizer = load_model(cfg.model, device=str(device), dtype=torch.float32)
    mode = resolve_mode(s.context_mode, tokenizer)
    ctx = TokenContext(tokenizer, mode)  # type: ignore[arg-type]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    examples, dropped = select_examples(ctx, episodes, not sft.keep_wrong, s.max_new_tokens)
    if not examples:
        raise ConfigError(f"none of the {len(episodes)} expert episodes is usable (dropped: {dropped})")
    log(f"sft: {len(examples)} episodes from {source}, dropped {dropped}; "
        f"{sum(e.n_labels for e in examples):,} action tokens of {sum(len(e.token_ids) for e in examples):,}")

    eval_env = rt.make_env(cfg, cfg.run.eval_split) if cfg.run.eval_n else None
    eval_prompts = rt.eval_prompts(env_registry.task_ids(eval_env), cfg.run.eval_n) if eval_env is not None else []

    def score() -> FormatScore | None:
        if eval_env is None:
            return None
        return well_formed_rate(rt.base_model(model), tokenizer, eval_env, eval_prompts, mode, s.max_turns, s.max_new_tokens, cfg.seed)

    before = score()
    if before is not None:
        log(f"sft: before: EM {before.em:.3f}, well-formed actions {before.well_formed:.3f} ({before.n} {cfg.run.eval_split} prompts)")
    if cfg.model_opts.lora:
        model = rt.with_lora(model, cfg.model_opts.lora_r, cfg.model_opts.lora_alpha, "LoRA SFT (--lora)")
    t_train = time.perf_counter()
    losses = train_examples(model, examples, sft, pad_id, device, progress, cfg.seed)
    log(f"sft: {len(losses)} steps in {time.perf_counter() - t_train:.0f} s, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    after = score()
    if after is not None:
        log(f"sft: after:  EM {after.em:.3f}, well-formed actions {after.well_formed:.3f}")
    meta = {"source": source, "base_model": cfg.model, "context_mode": mode, "examples": len(examples),
            "dropped": dropped, "episode_ids": [e.episode_id for e in examples], "losses": losses,
            "before": asdict(before) if before else None, "after": asdict(after) if after else None,
            "config": to_dict(cfg)}
    save_model(model, tokenizer, folder, meta)
    return SFTResult(folder, len(examples), dropped, sum(e.n_labels for e in examples), len(losses),
                     losses[0], losses[-1], before, after, time.perf_counter() - t0)


def expert_name(cfg: TrainConfig) -> str:
    """The expert ``cfg.sft.expert`` names: ``auto`` is the env family's (``Family.expert``)."""
    from treegym.envs.registry import family
    from treegym.trainers.sft_data import ExpertError

    if cfg.sft.expert != "auto":
        return cfg.sft.expert
    fam = family(cfg.env)
    if fam.expert is None:
        raise ExpertError(f"env {cfg.env!r} has no scripted expert; pass --traces from `treegym eval --out DIR`")
    return fam.expert
