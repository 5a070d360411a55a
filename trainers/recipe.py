"""The default recipe of ``treegym train``: a cached supervised warm start, then RL.

The embedded SmolLM2-135M never writes a well-formed ``<search>``/``<answer>`` turn on its
own, so RL from it sees reward 0 and learns nothing. The recipe first imitates the env's
scripted expert (``treegym.trainers.sft``) in the RL context format, then runs the configured
algorithm from that model. The warm start is cached under ``TREEGYM_HOME/warm-start``, keyed
by everything it depends on (``warm_start_key``), so a second run pays for it once.

Three held-out evaluations on the same prompts tell what each phase contributed: the untrained
model (stored with the warm start), the warm start (the RL run's "before") and the end of RL.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from treegym.agents.experts import warm_start_expert
from treegym.agents.models import load_model, resolve_model_folder
from treegym.agents.rollout.scoring import HeldOut
from treegym.envs.registry import FAMILIES, family, resolve_split, score_name
from treegym.errors import ConfigError
from treegym.paths import cache_dir, discard, folder_problem, seal_folder
from treegym.trainers import parallel
from treegym.trainers.config import SFTConfig, TrainConfig, validate
from treegym.trainers.heldout import (
    before_memo_path,
    evaluate_policy,
    memo_weights,
    phase_summary,
    remembered,
)
from treegym.trainers.loop import train
from treegym.trainers.metrics import plot_phases
from treegym.trainers.model import make_policy
from treegym.trainers.parallel import launched, pick_device, train_bf16
from treegym.trainers.prompts import make_env, preflight, train_env_kwargs
from treegym.trainers.sft import SFT_META, run_sft

# Bumped when what a warm start learns changes (2: SFT labels each action's end of turn, so
# every warm start built before, which never learnt to stop, is rebuilt rather than reused;
# 3: SFT runs under the update's bf16 autocast where the CPU has bf16 units).
WARM_START_VERSION = 3
# Bumped when the held-out protocol changes (2: turns end at the env's action stops).
WARM_START_EVAL = 2
# 24 heuristic episodes (about 20 kept) x 1 epoch at 2e-4 teach SmolLM2 the format: well-formed
# actions 19% -> 100%, dev EM 0% -> 37.5% on 16 prompts, in 3 optimiser steps (250 s on 2 busy cores).
WARM_START_LR = 2e-4


@dataclass(frozen=True)
class WarmStart:
    folder: Path
    cached: bool
    seconds: float  # spent now (0 when cached)
    examples: int
    untrained: HeldOut | None  # the base model on the run's held-out prompts


def wants_warm_start(cfg: TrainConfig) -> bool:
    """``auto``: for the embedded model (which cannot write the action format) on an env with an expert."""
    if cfg.warm_start == "off":
        return False
    has_expert = warm_start_expert(cfg.env) is not None  # the scripted expert the warm start imitates
    if cfg.warm_start == "on":
        if not has_expert:
            have = ", ".join(env_id for env_id in FAMILIES if warm_start_expert(env_id))
            raise ConfigError(f"warm_start=on: env {cfg.env!r} has no scripted expert (those that do: {have})")
        return True
    return cfg.model.lower() == "smollm2" and has_expert


def warm_start_key(cfg: TrainConfig) -> dict[str, Any]:
    s, defaults = cfg.sampler, SFTConfig()
    # sft settings off their defaults (so a default config keeps the key, and the cached model, it
    # had before SFT was a config section); out, episodes and lr are the warm start's own, and the
    # micro-batch splits a step without changing its loss
    changed = {k: v for k, v in dataclasses.asdict(cfg.sft).items()
               if k not in ("out", "episodes", "lr", "micro_batch_size") and v != getattr(defaults, k)}  # fmt: skip
    key = {
        "version": WARM_START_VERSION, "model": cfg.model, "env": cfg.env,
        "env_kwargs": train_env_kwargs(cfg), "expert": family(cfg.env).expert,
        "episodes": cfg.warm_start_episodes, "lr": WARM_START_LR, "max_turns": s.max_turns, "max_new_tokens": s.max_new_tokens,
        "context_mode": s.context_mode, "seed": cfg.seed, "train_split": cfg.run.train_split,
        # SFT's precision (bf16 autocast or fp32): a warm start built in one is not the other's
        "bf16": train_bf16(pick_device(cfg.model_opts.device), cfg.model_opts),
        # the untrained model's evaluation is stored with it
        "eval": [cfg.run.eval_split, cfg.run.eval_n, cfg.run.eval_temperature, s.max_context_tokens, WARM_START_EVAL],
    }  # fmt: skip
    return {**key, "sft": changed} if changed else key


def warm_start_config(cfg: TrainConfig, out: Path) -> TrainConfig:
    """The SFT run a warm start is: ``cfg`` with its episodes and learning rate, all weights trained
    (LoRA is for RL) and no held-out scores (the untrained model's are measured apart)."""
    ws = copy.deepcopy(cfg)
    ws.sft.out, ws.sft.episodes, ws.sft.lr = str(out), cfg.warm_start_episodes, WARM_START_LR
    ws.run.eval_n = 0
    ws.model_opts.lora = False
    ws.model_opts.device = str(pick_device(cfg.model_opts.device))
    return validate(ws)


def warm_start_folder(cfg: TrainConfig) -> Path:
    key = json.dumps(warm_start_key(cfg), sort_keys=True, default=str)
    name = cfg.env.replace(":", "_").replace("/", "_")
    return cache_dir("warm-start") / f"{name}-{Path(cfg.model).name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def warm_start(cfg: TrainConfig, progress: bool = True, log: Any = print) -> WarmStart:
    """The warm-started model for ``cfg`` (built now, or found in the cache)."""
    folder = warm_start_folder(cfg)
    cached = cached_warm_start(folder)
    if cached is not None:
        log(f"warm start: cached at {folder}")
        return cached
    if launched().on:
        raise ConfigError("the warm start is not cached yet: build it once in a single process "
                          "(`treegym train --steps 0` with the same config), then rerun under torchrun")
    t0 = time.perf_counter()
    log(f"warm start: evaluating the untrained {cfg.model}, then {cfg.warm_start_episodes} expert episodes and SFT")
    untrained = None
    if cfg.run.eval_n:  # the model as it is, on the run's held-out prompts (remembered: another warm start reuses it)
        device = pick_device(cfg.model_opts.device)

        def score_untrained() -> HeldOut | None:
            model, tokenizer = load_model(cfg.model, device=str(device), dtype=torch.float32)
            return evaluate_policy(make_policy(model, tokenizer, seed=cfg.seed, bf16=parallel.decode_bf16(device, cfg.model_opts)),
                                   make_env(cfg, cfg.run.eval_split),
                                   cfg, device, progress=progress)

        memo = before_memo_path(cfg, cfg.run.eval_split, memo_weights(cfg, resolve_model_folder(cfg.model)), "hf", device)
        untrained, was_remembered = remembered(memo, score_untrained)
        if was_remembered:
            log(f"warm start: the untrained {cfg.model}'s held-out evaluation is remembered ({memo})")
    if untrained is not None:
        log(f"warm start: untrained {cfg.model}: {score_name(cfg.env)} {untrained.success_rate:.3f} on {untrained.n} held-out prompts")
    tmp = folder.with_name(f".{folder.name}.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    result = run_sft(warm_start_config(cfg, tmp), progress=progress, log=log,
                     meta={"untrained": untrained.to_dict() if untrained is not None else None, "key": warm_start_key(cfg)})
    seal_folder(tmp)  # last: the folder is whole
    try:
        os.replace(tmp, folder)
    except OSError:  # another run finished the same warm start first; theirs is as good
        shutil.rmtree(tmp, ignore_errors=True)
    return WarmStart(folder, False, time.perf_counter() - t0, result.examples, untrained)


def cached_warm_start(folder: Path) -> WarmStart | None:
    """The warm start cached in ``folder``, or None when there is none to use.

    Its folder is sealed: weights cut, emptied or garbled (which still load, and then sample
    inf/nan), an ``sft.json`` that is garbage or not an object, or a file in the folder's place
    are found before anything is loaded. Such a folder is removed with a one-line warning and
    built again; under torchrun, where one process cannot build it for all, it is refused."""
    if not (folder.exists() or folder.is_symlink()):
        return None
    problem = folder_problem(folder)
    if problem is None:
        try:
            meta = json.loads((folder / SFT_META).read_text(encoding="utf-8"))
            if not isinstance(meta, dict):
                raise TypeError(f"{SFT_META} is a JSON {type(meta).__name__}, not an object")
            untrained = HeldOut.from_dict(meta["untrained"]) if meta.get("untrained") else None
            return WarmStart(folder, True, 0.0, int(meta.get("examples", 0)), untrained)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            problem = f"{SFT_META} cannot be read ({type(exc).__name__})"
    if launched().on:
        raise ConfigError(f"the cached warm start {folder} is broken ({problem}): build it again in a single "
                          "process (`treegym train --steps 0` with the same config), then rerun under torchrun")
    warnings.warn(f"rebuilding the cached warm start {folder}: {problem}", stacklevel=2)
    discard(folder)
    return None


def train_with_recipe(cfg: TrainConfig, progress: bool = True) -> str | None:
    """``treegym train``: the warm start (when wanted), RL, then ``phases.json``, its plot and the
    summary table (returned on the main process, None on the others)."""
    preflight(cfg)  # before the warm start
    main = launched().main
    base_model = cfg.model
    ws = None
    if wants_warm_start(cfg):
        ws = warm_start(cfg, progress=progress, log=print if main else (lambda *_: None))
        cfg.model = str(ws.folder)
    result = train(cfg, progress=progress, checked=True)  # preflight ran above, once
    if not main:
        return None
    if not cfg.run.keep_checkpoints:
        # The run is finished: its resumable state (optimiser included) is no longer needed.
        shutil.rmtree(result.folder / "checkpoints", ignore_errors=True)
    start = "after warm start" if ws is not None else "before RL"
    phases = phase_summary([("untrained", ws.untrained if ws is not None else None), (start, result.eval_before),
                            ("after RL", result.eval_after)])  # fmt: skip
    if result.also_before is not None or result.also_after is not None:  # run.also_eval_split
        phases["also"] = {"split": cfg.run.also_eval_split,
                          **phase_summary([(start, result.also_before), ("after RL", result.also_after)])}
    (result.folder / "phases.json").write_text(json.dumps(phases, indent=2) + "\n")
    plot_phases(phases, result.folder / "plots" / "phases.png", f"{cfg.algo} on {cfg.env}")
    return summary_table(cfg, base_model, result, ws, phases)


def rl_phase_gain(phases: dict[str, Any]) -> float:
    """The paired gain of a run's RL phase in its ``phases.json`` (or its ``also`` part): after RL
    minus the phase before it, on the same prompts."""
    return next(v[0] for k, v in phases["gains"].items() if k.endswith("-> after RL") and not k.startswith("untrained"))


def summary_table(cfg: TrainConfig, base_model: str, result: Any, ws: WarmStart | None, phases: dict[str, Any]) -> str:
    """The table ``treegym train`` prints: each phase's held-out score and the paired gains."""
    def pct(v: list[float]) -> str:
        return f"{100 * v[0]:5.1f}% [{100 * v[1]:.1f}, {100 * v[2]:.1f}]"

    def pts(v: list[float]) -> str:
        return f"{100 * v[0]:+.1f} pts [{100 * v[1]:+.1f}, {100 * v[2]:+.1f}]"

    metric = score_name(cfg.env)
    warm = "" if ws is None else (f" after a warm start on {ws.examples} expert episodes "
                                  f"({'cached' if ws.cached else f'built in {ws.seconds:.0f} s'})")
    rows = [("algorithm", f"{cfg.algo}{warm}"), ("env / model", f"{cfg.env} / {base_model}"),
            ("steps / tokens", f"{result.steps} / {result.tokens_total:,} generated")]
    also = phases.get("also")  # with a second held-out split, every row names its split
    for ph, on in [(phases, f" ({resolve_split(cfg.env, cfg.run.eval_split)})" if also else ""),
                   *([(also, f" ({also['split']})")] if also else [])]:
        for name, p in ph["phases"].items():
            rows.append((f"{metric} {name}{on}", f"{pct(p['success'])}  well-formed {100 * p['well_formed'][0]:.0f}%, "
                                                 f"tool calls/episode {p['tool_calls'][0]:.2f}  (n={p['n']})"))
        for name, g in ph["gains"].items():
            wf = ph.get("well_formed_gains", {}).get(name)
            rows.append((f"gain {name}{on}", pts(g) + (f"  well-formed {pts(wf)}" if wf else "")))
    rows += [("time (RL phase)", f"{result.seconds:.0f} s"), ("run folder", str(result.folder))]
    final = Path(result.folder) / "final"
    if final.exists():
        rows.append(("trained policy", f"{final}  (treegym eval --agent {final})"))
    width = max(len(k) for k, _ in rows)
    line = "-" * (width + 3 + max(len(v) for _, v in rows))
    note = "(95% intervals: Wilson for the score, paired bootstrap over the same held-out prompts for gains)"
    return "\n".join([line, *(f"{k:<{width}}   {v}" for k, v in rows), note, line])
