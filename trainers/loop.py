"""The training loop shared by every algorithm, in torchtune's shape. Reads top to bottom:

- ``setup(cfg, folder, dist, device) -> Run``: model, optimiser, envs, resume, log;
- ``sample(run) -> RolloutBatch``: this process's prompts, rolled out by the algorithm's sampler;
- ``train_step(run, batch) -> metrics`` (``treegym.trainers.step``): advantages -> old (and
  reference) log-probs with the pre-update model -> the update (``treegym.trainers.update``) ->
  metrics, reduced by name;
- ``finish(run) -> TrainResult``: final weights, held-out eval, plots, trees, summary.

``train(cfg)`` runs them, with held-out evals and checkpoints between steps. Runs under
``torchrun`` as data-parallel replicas (DDP) or shards (FSDP2, ``treegym.trainers.parallel``);
every process samples its own prompts and the gradients are averaged. The rollout engine
(``treegym.trainers.engines``: transformers or a colocated vLLM) gets the new weights after
every update.
"""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from treegym.agents.models import resolve_model_folder
from treegym.agents.rollout.context import resolve_mode
from treegym.agents.rollout.scoring import HeldOut
from treegym.agents.rollout.types import RolloutBatch
from treegym.agents.tree_html import write_tree_html
from treegym.envs import registry as env_registry
from treegym.errors import TreegymError
from treegym.trainers import engines, parallel
from treegym.trainers import update as upd
from treegym.trainers.algorithms import Algorithm, get_algorithm
from treegym.trainers.checkpoint import (
    TrainState,
    load_latest_checkpoint,
    rng_state,
    save_checkpoint,
    save_policy,
)
from treegym.trainers.config import TrainConfig
from treegym.trainers.heldout import before_memo_path, evaluate_policy, memo_weights, remembered, run_protocol
from treegym.trainers.logprobs import TokenScorer
from treegym.trainers.metrics import MetricsLog, plot_metrics, read_metrics
from treegym.trainers.model import frozen_copy, load_trainable_model, policy_generators
from treegym.trainers.prompts import make_env, preflight, sampling_params, train_prompts
from treegym.trainers.run_folder import RunLock, open_run_folder, remove_if_unused
from treegym.trainers.step import CURRENCY_TOTALS, TrainingError, train_step


@dataclass
class TrainResult:
    """What ``train`` returns (and writes to ``summary.json``): held-out success before the
    first step and after the last, per prompt too, and what the run cost."""

    folder: Path
    steps: int
    success_before: float | None
    success_after: float | None
    tokens_total: int
    seconds: float
    history: list[dict[str, Any]] = field(default_factory=list)
    replica_digests: list[str] = field(default_factory=list)
    eval_before: HeldOut | None = None  # per held-out prompt, before the first step
    eval_after: HeldOut | None = None
    also_before: HeldOut | None = None  # the same on run.also_eval_split
    also_after: HeldOut | None = None


def train(cfg: TrainConfig, *, progress: bool = True, checked: bool = False) -> TrainResult:
    """Run (or resume) the training described by ``cfg``; returns the run's summary. ``checked``:
    the caller has run ``preflight(cfg)`` already (``treegym train`` does, before its warm start)."""
    t_start = time.time()
    if not checked:
        preflight(cfg)
    dist, device = parallel.setup_distributed(cfg.model_opts.device)
    folder: Path | None = None
    lock: RunLock | None = None
    try:
        folder, lock = _open_folder(cfg, dist)
        run = setup(cfg, folder, dist, device, progress)
        bar = tqdm(total=cfg.steps, initial=run.state.step, desc=f"{cfg.algo} on {cfg.env}",
                   disable=not (progress and dist.main))
        batch = None  # the last step's, for its trees' view
        while run.state.step < cfg.steps and not _budget_spent(cfg, run.state):
            batch = sample(run)
            metrics = train_step(run, batch)
            if run.log is not None and run.state.step % cfg.run.log_every == 0:
                run.log.log(run.state.step, metrics)
            bar.update(1)
            bar.set_postfix(reward=f"{metrics['reward']:.3f}", kl=f"{metrics.get('approx_kl', 0):.4f}",
                            tokens=run.state.tokens_total)
            # held-out success now and then; checkpoint (every process contributes its RNG stream)
            finished = run.state.step >= cfg.steps or _budget_spent(cfg, run.state)
            if cfg.run.eval_every and run.state.step % cfg.run.eval_every == 0 and not finished:
                run.log_eval(run.state.step, run.evaluate(run.eval_env))
            if (cfg.run.save_every and run.state.step % cfg.run.save_every == 0) or finished:
                rngs = parallel.gather_objects(rng_state(policy_generators(run.engine.policy)), dist)
                gathered = parallel.checkpoint_state(run.model, run.updater.optimizer) if run.sharded else None
                if dist.main:
                    save_checkpoint(folder / "checkpoints", run.model, run.updater.optimizer, run.state, rngs,
                                    gathered=gathered)
        bar.close()
        result = finish(run, t_start, batch)
        parallel.barrier(dist)  # no process tears the group down while a peer is still in a collective
        return result
    except BaseException:
        if folder is not None and dist.main:
            remove_if_unused(folder)  # a failed run leaves no empty run folder behind
        raise
    finally:
        if lock is not None:
            lock.release()
        parallel.teardown_distributed(dist)


def _open_folder(cfg: TrainConfig, dist: parallel.Dist) -> tuple[Path, RunLock | None]:
    """The main process opens (and locks) the run folder; every process gets it, or the same error."""
    got: Path | TreegymError | None = None
    lock = None
    if dist.main:
        try:
            got, lock = open_run_folder(cfg, time.strftime("%Y%m%d-%H%M%S"))
        except TreegymError as exc:
            got = exc
    got = parallel.broadcast_object(got, dist)
    if isinstance(got, TreegymError):
        raise got
    assert got is not None
    return got, lock


@dataclass
class Run:
    """Everything a training run holds between steps."""

    cfg: TrainConfig
    folder: Path
    dist: parallel.Dist
    device: torch.device
    algo: Algorithm
    model: torch.nn.Module
    tokenizer: Any
    scorer: TokenScorer
    reference: torch.nn.Module | None
    updater: upd.Update
    engine: engines.Engine  # the sampling policy, and how it follows the trained weights
    env: Any
    eval_env: Any
    task_ids: list[Any] | None
    state: TrainState
    log: MetricsLog | None
    sample_seconds: float = 0.0  # the last ``sample``'s wall time
    progress: bool = False
    sharded: bool = False  # FSDP: ``model``'s parameters are this process's shards
    also_env: Any = None  # the run.also_eval_split env, scored before and after

    def evaluate(self, env: Any, temperature: float | None = None) -> HeldOut | None:
        """One chain per held-out prompt of ``env`` (``eval_env`` or ``also_env``; None: no evaluation)."""
        return evaluate_policy(self.engine.policy, env, self.cfg, self.device, temperature=temperature,
                               dist=self.dist, progress=self.progress and self.dist.main)

    def evaluate_before(self, env: Any, split: str) -> HeldOut | None:
        """``evaluate(env)`` of the model as loaded, remembered across runs of the same sealed model
        folder (``heldout.before_memo_path``: another seed from one warm start scores it once)."""
        path = None if env is None else before_memo_path(self.cfg, split, self.memo_weights, self.engine.backend, self.device)
        got, was_remembered = remembered(path, lambda: self.evaluate(env))
        if was_remembered and self.dist.main:
            print(f"held-out {env_registry.resolve_split(self.cfg.env, split)} before RL: remembered ({path})")
        return got

    @cached_property
    def memo_weights(self) -> str | None:
        """The loaded model folder's key in the memo, its seal checked once per run (None under torchrun)."""
        return None if self.dist.on else memo_weights(self.cfg, resolve_model_folder(self.cfg.model))

    def log_eval(self, step: int, got: HeldOut | None) -> None:
        """Log held-out success (and, with run.eval_sampled, at temperature 1 as eval_success_t1)."""
        if got is None:
            return
        row = {"eval_success": got.success_rate, "tokens_total": self.state.tokens_total,
               **{k: self.state.extra.get(k, 0) for k in CURRENCY_TOTALS}}
        if self.cfg.run.eval_sampled:
            sampled = self.evaluate(self.eval_env, 1.0)
            row["eval_success_t1"] = None if sampled is None else sampled.success_rate
        if self.log is not None:
            self.log.log(step, row)


def setup(cfg: TrainConfig, folder: Path, dist: parallel.Dist, device: torch.device, progress: bool = False) -> Run:
    """Model, optimiser, policy, envs; resume from the latest checkpoint; the log; success before."""
    algo = get_algorithm(cfg.algo)
    backend = engines.resolve_backend(cfg, device, dist.world)
    sharded = dist.on and cfg.model_opts.parallel == "fsdp"
    parallel.seed_everything(cfg.seed * 1000 + dist.rank)
    if device.type == "cpu":
        parallel.keep_freed_memory()
    model, tokenizer = load_trainable_model(cfg, device)
    # The sampling engine and the KL reference see whole weights: built before any sharding.
    engine = engines.build(cfg, backend, model, tokenizer, seed=cfg.seed * 1000 + dist.rank, sharded_later=sharded)
    reference = frozen_copy(model) if cfg.loss.use_kl else None
    scorer = TokenScorer(model)
    trainer = parallel.wrap(scorer, cfg.model_opts.parallel, dist.world, device)
    params = [p for p in model.parameters() if p.requires_grad]  # FSDP: the shards
    optimizer = parallel.adamw(params, cfg.optim.lr, cfg.optim.weight_decay)
    updater = upd.Update(trainer, optimizer, params, algo.loss, algo.loss_options(cfg), cfg, dist, device)
    generators = policy_generators(engine.policy)  # checkpoints restore their streams
    env = make_env(cfg, cfg.run.train_split)
    state = TrainState()
    loaded = load_latest_checkpoint(folder / "checkpoints", model, optimizer, dist.rank, generators) if cfg.run.resume else None
    if loaded is not None:
        state, path = loaded
        engine.after_update(model)  # the engine samples the resumed weights
        if dist.main:
            print(f"resumed from {path} (step {state.step})")
    log = MetricsLog(folder, state.step, tensorboard=cfg.run.tensorboard, wandb=cfg.run.wandb,
                     config=asdict(cfg)) if dist.main else None
    run = Run(cfg=cfg, folder=folder, dist=dist, device=device, algo=algo, model=model, tokenizer=tokenizer,
              scorer=scorer, reference=reference, updater=updater, env=env, task_ids=env_registry.task_ids(env),
              eval_env=make_env(cfg, cfg.run.eval_split) if cfg.run.eval_n else None, state=state, log=log,
              progress=progress, engine=engine, sharded=sharded,
              also_env=make_env(cfg, cfg.run.also_eval_split) if cfg.run.eval_n and cfg.run.also_eval_split else None)
    if dist.main and device.type == "cpu" and parallel.train_bf16(device, cfg.model_opts):
        print("bf16 on this CPU (it has bf16 matmul units): the update under autocast, sampling and evaluation "
              "through the bf16 decoder; weights and AdamW stay fp32; --model_opts.cpu_bf16=off for fp32 throughout")
    if dist.main and cfg.run.eval_n:  # what `treegym eval --agent RUN/final` replays
        run_protocol(cfg).write(folder)
    if "em_before" in state.extra:  # a checkpoint written before success had its own name
        state.extra["success_before"] = state.extra.pop("em_before")
    if "success_before" not in state.extra:
        before = run.evaluate_before(run.eval_env, cfg.run.eval_split)
        state.extra["success_before"] = None if before is None else before.success_rate
        state.extra["eval_before"] = None if before is None else before.to_dict()
        run.log_eval(0, before)
    if run.also_env is not None and "also_before" not in state.extra:
        also = run.evaluate_before(run.also_env, cfg.run.also_eval_split)
        state.extra["also_before"] = None if also is None else also.to_dict()
    return run


def sample(run: Run) -> RolloutBatch:
    """This process's slice of the global prompt stream, rolled out; the leaves carry rewards."""
    cfg, dist, state = run.cfg, run.dist, run.state
    start = state.data_position + dist.rank * cfg.prompts_per_step
    prompts = train_prompts(run.task_ids, cfg.seed, start, cfg.prompts_per_step)
    state.data_position += cfg.prompts_per_step * dist.world
    run.model.eval()
    t0 = time.time()
    with torch.no_grad(), parallel.autocast(run.device, parallel.generate_bf16(run.device, cfg.model_opts)):
        batch = run.algo.sample(run.engine.policy, run.env, prompts, cfg, sampling_params(cfg),
                                resolve_mode(cfg.sampler.context_mode, run.tokenizer),
                                cfg.seed * 100_003 + state.step * dist.world + dist.rank)
    run.sample_seconds = time.time() - t0
    return batch


def finish(run: Run, t_start: float, last: RolloutBatch | None = None) -> TrainResult:
    """Final weights, success after, plots, the trees of the ``last`` step, and the summary."""
    cfg, dist, state, folder = run.cfg, run.dist, run.state, run.folder
    sampled = run.engine.replica if run.engine.replica is not None else run.model  # whole weights, as sampled
    if dist.main:
        save_policy(sampled, run.tokenizer, folder / "final")
    after = run.evaluate(run.eval_env)
    run.log_eval(state.step, after)
    also_after = run.evaluate(run.also_env)
    digests = parallel.gather_objects(parallel.weights_digest(sampled), dist)
    history: list[dict[str, Any]] = []
    if run.log is not None:
        run.log.close()
        history = read_metrics(folder / "metrics.jsonl")
        if cfg.run.plots:
            plot_metrics(folder)
        if cfg.run.trees_html and last is not None:
            try:
                write_tree_html(folder / "trees.html", last.trees, run.tokenizer,
                                title=f"{cfg.algo}: rollout trees of step {state.step}")
            except Exception as exc:  # a view is a convenience: never lose a finished run over it
                warnings.warn(f"could not write {folder / 'trees.html'}: {exc}", stacklevel=1)
    before_data, also_data = state.extra.get("eval_before"), state.extra.get("also_before")
    result = TrainResult(folder=folder, steps=state.step, success_before=state.extra["success_before"],
                         success_after=None if after is None else after.success_rate, tokens_total=state.tokens_total,
                         seconds=time.time() - t_start, history=history, replica_digests=digests,
                         eval_before=HeldOut.from_dict(before_data) if before_data else None, eval_after=after,
                         also_before=HeldOut.from_dict(also_data) if also_data else None, also_after=also_after)
    if dist.main:
        summary = {k: v.to_dict() if isinstance(v, HeldOut) else v for k, v in result.__dict__.items() if k != "history"}
        (folder / "summary.json").write_text(json.dumps({**summary, "folder": str(folder), "world": dist.world}, indent=2))
    if len(set(digests)) > 1:
        raise TrainingError(f"data-parallel replicas diverged: weight digests {digests}")
    return result


def _budget_spent(cfg: TrainConfig, state: TrainState) -> bool:
    return (bool(cfg.token_budget) and state.tokens_total >= cfg.token_budget) or (
        bool(cfg.tool_budget) and state.extra.get("tool_calls_total", 0) >= cfg.tool_budget)
