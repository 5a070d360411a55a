"""The envs and prompts of a run: its training variant, the training prompt stream and the
sampling parameters (its held-out prompts are ``treegym eval``'s, ``agents.eval.chosen_prompts``)."""

from __future__ import annotations

import random
from typing import Any

import gymnasium as gym

from treegym.agents.models import resolve_model_folder
from treegym.agents.policy import SamplingParams
from treegym.envs import registry as env_registry
from treegym.errors import ConfigError
from treegym.trainers import engines, parallel
from treegym.trainers.config import TrainConfig
from treegym.trainers.run_folder import refuse_unmakeable, run_folder_path


def sampling_params(cfg: TrainConfig, temperature: float | None = None, top_p: float | None = None) -> SamplingParams:
    """The sampler section as ``SamplingParams`` (``temperature``/``top_p`` override it: evals)."""
    s = cfg.sampler
    return SamplingParams(temperature=s.temperature if temperature is None else temperature,
                          top_p=s.top_p if top_p is None else top_p, max_new_tokens=s.max_new_tokens,
                          ignore_eos=s.ignore_eos)


def train_env_kwargs(cfg: TrainConfig) -> dict[str, Any]:
    """The env kwargs of a training run: its training variant's, under the user's ``env_kwargs``."""
    return {**env_registry.env_kwargs(env_registry.training_id(cfg.env)), **cfg.env_kwargs}


def make_env(cfg: TrainConfig, split: str) -> gym.Env:
    """One env of the run's training variant (``registry.training_id``) on ``split``, with the
    sampler's turn budget."""
    return env_registry.make(env_registry.training_id(cfg.env), split, max_turns=cfg.sampler.max_turns,
                             **cfg.env_kwargs)


def preflight(cfg: TrainConfig) -> None:
    """Fail in a second, before any model load, run folder or warm start: the env id, its splits,
    the model, how the update is parallel, and the rollout engine as ``model_opts.device`` would
    pick it (e.g. sampler.backend=vllm without vllm)."""
    env_registry.resolve_split(cfg.env, cfg.run.train_split)
    if cfg.run.eval_n:
        for split in filter(None, (cfg.run.eval_split, cfg.run.also_eval_split)):
            env_registry.resolve_split(cfg.env, split)
    refuse_unmakeable(run_folder_path(cfg, "preflight"))  # refused before a model converts, not after
    resolve_model_folder(cfg.model)
    if cfg.model_opts.parallel == "fsdp" and cfg.model_opts.lora:
        raise ConfigError("config field model_opts.parallel: fsdp does not shard LoRA runs (their optimiser state "
                          "is small); use model_opts.parallel=ddp with model_opts.lora=true")
    engines.resolve_backend(cfg, parallel.pick_device(cfg.model_opts.device), parallel.launched().world)


def train_prompts(ids: list[Any] | None, seed: int, start: int, count: int) -> list[Any]:
    """Prompts ``start .. start+count`` of the training stream: a reshuffled pass per epoch."""
    out = []
    for pos in range(start, start + count):
        if ids is None:
            out.append(1_000_003 * (seed + 1) + pos)
            continue
        epoch, i = divmod(pos, len(ids))
        order = list(range(len(ids)))
        random.Random(seed * 7919 + epoch).shuffle(order)
        out.append({"task_id": ids[order[i]]})
    return out
