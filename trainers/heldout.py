"""Held-out evaluation of a policy, per prompt, so that phases can be compared pairwise.

One protocol (``run_protocol``, a ``treegym.agents.protocol.Protocol`` the run writes for ``treegym
eval --agent RUN/final``) and one function (``evaluate_policy``) for every phase of a run (untrained,
warm start, end of RL) and for SFT's before/after: one chain per held-out prompt (the set ``treegym
eval --n`` plays), greedy by default, scored as ``treegym eval`` scores it (``EpisodeScore``). The
result keeps one score per prompt, in prompt order, so that two evaluations on the same prompts
give a paired gain with its interval (``phase_summary``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, astuple
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from treegym.agents.eval import progress_bar
from treegym.agents.policy import Policy
from treegym.agents.protocol import Protocol, play_protocol
from treegym.agents.rollout.scoring import HeldOut, heldout_from_batch
from treegym.envs import registry as env_registry
from treegym.paths import FOLDER_SEAL, cache_dir, digest, folder_problem, write_atomically
from treegym.stats import paired_difference
from treegym.trainers import parallel
from treegym.trainers.config import TrainConfig


def run_protocol(cfg: TrainConfig, split: str | None = None, temperature: float | None = None) -> Protocol:
    """A run's held-out protocol: its training variant and ``env_kwargs`` on ``split`` (``run.eval_split``), its first
    ``run.eval_n`` tasks, the sampler's turns, tokens, context and cap, at ``temperature`` (``run.eval_temperature``)."""
    s = cfg.sampler
    return Protocol(variant=env_registry.training_id(cfg.env),
                    split=env_registry.resolve_split(cfg.env, cfg.run.eval_split if split is None else split),
                    n=cfg.run.eval_n, max_turns=s.max_turns, max_new_tokens=s.max_new_tokens, mode=s.context_mode,
                    temperature=cfg.run.eval_temperature if temperature is None else temperature,
                    env_kwargs=dict(cfg.env_kwargs), max_context_tokens=s.max_context_tokens, ignore_eos=s.ignore_eos)


def evaluate_policy(policy: Policy, env: Any, cfg: TrainConfig, device: torch.device, *,
                    temperature: float | None = None, dist: parallel.Dist = parallel.Dist(),
                    progress: bool = False) -> HeldOut | None:
    """``policy`` on the run's held-out prompts of ``env``, one chain each, with the trainer's turn
    budget, turn length, context format and cap, at ``temperature`` (default ``run.eval_temperature``),
    without grad and under the run's autocast. Under torchrun each process plays its share and
    every process gets the whole evaluation, in prompt order; None when there are no prompts (or
    no ``env``: the run evaluates nothing). ``progress`` shows a bar of agent turns (at most
    prompts x max_turns)."""
    if env is None:
        return None
    protocol = run_protocol(cfg, temperature=temperature)  # its split is the env's, made by the caller
    prompts = protocol.prompts(env)[dist.rank :: dist.world]
    local = None
    if prompts:
        bar = progress_bar(len(prompts) * cfg.sampler.max_turns, f"held-out eval ({len(prompts)} prompts)", progress, "turn", leave=False)
        with torch.no_grad(), parallel.autocast(device, parallel.generate_bf16(device, cfg.model_opts)), bar:
            batch = play_protocol(policy, env, prompts, protocol, progress=bar)
        local = heldout_from_batch(batch)
    return HeldOut.merge(parallel.gather_objects(local, dist)) if dist.on else local


def phase_summary(stages: Sequence[tuple[str, HeldOut | None]]) -> dict[str, Any]:
    """Each phase's held-out success, well-formed share and tool calls with 95% intervals, and
    the paired gains on the same prompts between consecutive phases (and first to last), of
    success (``gains``) and of the well-formed share (``well_formed_gains``)."""
    got = [(name, h) for name, h in stages if h is not None]
    out: dict[str, Any] = {"phases": {}, "gains": {}, "well_formed_gains": {}}
    for name, h in got:
        iv = h.intervals()
        out["phases"][name] = {"n": h.n, **{k: list(astuple(iv[k])) for k in ("success", "well_formed", "tool_calls")}}
    pairs = list(zip(got, got[1:])) + ([(got[0], got[-1])] if len(got) > 2 else [])
    for (n0, h0), (n1, h1) in pairs:
        if h0.n == h1.n:
            for key, name in (("gains", "success"), ("well_formed_gains", "well_formed")):
                out[key][f"{n0} -> {n1}"] = list(astuple(paired_difference(h1.values(name), h0.values(name))))
    return out


# ---- the evaluation before RL, remembered ------------------------------------------------------

MEMO_VERSION = 1


def memo_weights(cfg: TrainConfig, folder: Path) -> str | None:
    """The weights in ``folder`` as the memo knows them: the SHA-256 of its seal (which holds the
    SHA-256 of every file, so other weights are another key), checked once; None where nothing is
    remembered: ``run.memo_before=false``, a sampled evaluation (its figures depend on the seed),
    a folder without a holding seal."""
    if not cfg.run.memo_before or cfg.run.eval_temperature != 0.0 or folder_problem(folder) is not None:
        return None
    return digest(folder / FOLDER_SEAL)


def before_memo_path(cfg: TrainConfig, split: str, weights: str | None, backend: str, device: torch.device) -> Path | None:
    """Where the greedy held-out evaluation of ``weights`` (``memo_weights``) on ``split`` is
    remembered (``remembered``), or None where it cannot be (``weights`` None).

    The same model folder scored by the same protocol gives the same figures: a second training
    seed from one warm start, or a rerun over a cached one, scores it again for nothing. The key
    is everything the figures depend on: the weights, the protocol (``run_protocol`` on
    ``split``), the sampling backend, LoRA, bf16 and the device type, and the source of the
    treegym code that plays it (an edited env or sampler is another key)."""
    if weights is None:
        return None
    key = {"version": MEMO_VERSION, "seal": weights, "protocol": asdict(run_protocol(cfg, split=split)),
           "backend": backend, "lora": cfg.model_opts.lora, "bf16": parallel.generate_bf16(device, cfg.model_opts) or parallel.decode_bf16(device, cfg.model_opts), "device": device.type,
           "code": code_digest()}
    name = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:24]
    return cache_dir("heldout-memo") / f"{name}.json"


def remembered(path: Path | None, evaluate: Callable[[], HeldOut | None]) -> tuple[HeldOut | None, bool]:
    """``evaluate()``'s result, read from ``path`` when an earlier call wrote it there (then True),
    else computed and written (atomically) for the next call. An unreadable memo is evaluated again."""
    if path is not None and path.is_file():
        try:
            return HeldOut.from_dict(json.loads(path.read_text(encoding="utf-8"))), True
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            warnings.warn(f"ignoring the remembered evaluation {path} ({type(exc).__name__}): scoring again", stacklevel=2)
    got = evaluate()
    if path is not None and got is not None:
        write_atomically(path, lambda tmp: tmp.write_text(json.dumps(got.to_dict()), encoding="utf-8"))
    return got, False


@lru_cache(maxsize=1)
def code_digest() -> str:
    """SHA-256 over the source of every treegym package (``treegym``, its envs, agents, trainers),
    found where they are installed (read, not imported: the face sits above this layer). Read once
    per process: the key names the code this process runs, so a file edited while a long benchmark
    runs neither misses its memo nor files a figure under code that did not make it."""
    h = hashlib.sha256()
    for name in ("treegym", "treegym.envs", "treegym.agents", "treegym.trainers"):
        spec = importlib.util.find_spec(name)
        for location in (spec.submodule_search_locations or []) if spec is not None else []:
            root = Path(location)
            for path in sorted(root.rglob("*.py")):
                h.update(str(path.relative_to(root)).encode())
                h.update(path.read_bytes())
    return h.hexdigest()
