"""What an equal-budget study runs: tasks, methods, budgets and seeds, as plain values.

A *task* is a probe env with its shape (horizon, choices, turn length). A *method* is an
algorithm plus the config overrides that make it what it is (an expansion rule, a credit
shape). A *budget* is the rollout budget per prompt in trajectory-equivalents B: GRPO samples
B chains; the tree methods grow B/2 trees (m), each one chain plus n=2 branches (l=1) with
every leaf kept, so a tree method spends about B chains' tokens per prompt under the
reference expansion and less under cheaper rules. Every run of a task, whatever its method
and B, stops at the same total of generated tokens, and each step costs about
``STEP_CHAINS`` chains' tokens (prompts per step = STEP_CHAINS / B), so B only decides how a
fixed budget is split between prompts and samples per prompt.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

STEP_CHAINS = 16  # chain-equivalents of rollout per training step


@dataclass(frozen=True)
class Task:
    name: str
    env: str
    horizon: int
    choices: int
    turn_tokens: int
    chains: int  # total rollout budget of a run, in chain-equivalents (x horizon x turn_tokens tokens)
    env_kwargs: tuple[tuple[str, Any], ...] = ()  # the env's other arguments (ProbeMaze's doors)
    currency: str = "tokens"  # what every run of the task stops at: "tokens" (generated) or "tool_calls"
    tool_calls: int = 0  # with currency "tool_calls": the tool calls a run may make
    prior: str = "uniform"  # the probe model's format prior (envs.probe_model.PRIORS)

    def make_kwargs(self) -> dict[str, Any]:
        return {"horizon": self.horizon, "choices": self.choices, **dict(self.env_kwargs)}

    @property
    def chain_tokens(self) -> int:
        return self.horizon * self.turn_tokens

    @property
    def token_budget(self) -> int:
        return self.chains * self.chain_tokens


@dataclass(frozen=True)
class Method:
    name: str
    algo: str
    overrides: tuple[tuple[str, Any], ...] = ()
    # The search space tuned on the tuning seeds: each entry is one set of overrides.
    tune: tuple[tuple[tuple[str, Any], ...], ...] = ()


@dataclass(frozen=True)
class RunSpec:
    """One training run of the grid; ``key`` identifies it in the results file."""

    phase: str  # "tune", "ablate" or "report"
    task: Task
    method: Method
    budget: int  # trajectory-equivalents per prompt
    seed: int
    setting: tuple[tuple[str, Any], ...] = ()  # tuned hyperparameters (or the one being tried)
    eval_n: int = 64
    evals: int = 4  # held-out evaluations during the run, besides before and after

    @property
    def key(self) -> str:
        task = {k: v for k, v in asdict(self.task).items() if not (k == "prior" and v == "uniform")}  # keys before priors
        data = {"phase": self.phase, "task": task, "method": self.method.name,
                "overrides": list(self.method.overrides), "budget": self.budget, "seed": self.seed,
                "setting": list(self.setting), "eval_n": self.eval_n, "evals": self.evals}  # fmt: skip
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def overrides(self, model: str, out_dir: str) -> dict[str, Any]:
        """The full ``treegym train`` config of this run."""
        t, b = self.task, self.budget
        prompts = max(1, STEP_CHAINS // b)
        steps_est = max(1, t.chains // STEP_CHAINS)
        cfg: dict[str, Any] = {
            "algo": self.method.algo, "env": t.env, "env_kwargs": t.make_kwargs(),
            "model": model, "seed": self.seed, "steps": 10**6,
            # A tool-call budget is capped at 4x the task's tokens: a policy that stops calling the
            # tool would otherwise never spend it.
            "token_budget": t.token_budget if t.currency == "tokens" else 4 * t.token_budget,
            "tool_budget": t.tool_calls if t.currency == "tool_calls" else 0,
            "prompts_per_step": prompts, "sampler.group_size": b, "sampler.trees": max(1, b // 2),
            "sampler.expand_nodes": 2, "sampler.rounds": 1, "sampler.leaves": 64,  # every leaf kept: a rule may grow more in one tree
            "sampler.max_turns": t.horizon, "sampler.max_new_tokens": t.turn_tokens, "sampler.ignore_eos": True,
            "sampler.max_context_tokens": 4096,
            # One optimiser step per training step, whatever number of leaves a rule grows.
            "optim.mini_batch_size": 4096, "optim.micro_batch_size": 4096,
            "run.eval_n": self.eval_n, "run.eval_sampled": True, "run.eval_every": max(1, steps_est // (self.evals + 1)),
            "run.out_dir": out_dir, "run.name": f"{self.phase}-{t.name}-{self.method.name}-B{b}-s{self.seed}-{self.key}",
            "run.resume": False, "run.save_every": 0, "run.tensorboard": False, "run.trees_html": False,
            "run.plots": False, "run.train_split": "train", "run.eval_split": "dev",
        }  # fmt: skip
        cfg.update(dict(self.method.overrides))
        cfg.update(dict(self.setting))
        return cfg


# ---- the default grid ---------------------------------------------------------------------------

TASKS = {
    "lock": Task("lock", "ProbeLock-v0", horizon=3, choices=2, turn_tokens=4, chains=512),
    "lookup": Task("lookup", "ProbeLookup-v0", horizon=2, choices=3, turn_tokens=4, chains=512),
    "keys": Task("keys", "ProbeKeys-v0", horizon=4, choices=4, turn_tokens=4, chains=512),
    "lock-L1": Task("lock-L1", "ProbeLock-v0", horizon=3, choices=2, turn_tokens=1, chains=512),
    "lock-L16": Task("lock-L16", "ProbeLock-v0", horizon=3, choices=2, turn_tokens=16, chains=512),
    "lock5": Task("lock5", "ProbeLock-v0", horizon=5, choices=2, turn_tokens=4, chains=768),
    # Shaped like agent work: long turns whose move is the first word; a deep horizon with visible
    # failure and a terminal reward; a tool whose calls are the currency.
    # Budgets sized so that some method moves: at 320 maze chains, 192 lock-L32 chains and 64
    # lookup calls no method left its start (benchmarks/results/study-agent-probes).
    "lock-L32": Task("lock-L32", "ProbeLock-v0", horizon=3, choices=2, turn_tokens=32, chains=384),
    "maze": Task("maze", "ProbeMaze-v0", horizon=8, choices=2, turn_tokens=4, chains=640, env_kwargs=(("doors", 6),)),
    "lookup-calls": Task("lookup-calls", "ProbeLookup-v0", horizon=2, choices=3, turn_tokens=4, chains=512,
                         currency="tool_calls", tool_calls=128),
    # The tool probe shaped like LLM agents: the model already uses a tool's result (as an instruct
    # LLM does) but calls at the format's rate; RL must learn when to call, paid in tool calls.
    "lookup-when": Task("lookup-when", "ProbeLookup-v0", horizon=2, choices=3, turn_tokens=4, chains=512,
                        currency="tool_calls", tool_calls=64, prior="uses_tools"),
}

# Four rates per method, from one that barely moves to one that often collapses on the probes.
_LRS = (5e-4, 1e-3, 2e-3, 4e-3)
PG_TUNE = tuple((("optim.lr", lr),) for lr in _LRS)
# TreeOPSD's per-token weight is |r* - 1| <= eps (about |A| at its defaults, beta 1 and eps 1),
# and half its advantage is the turn credit in reward units: its grid sits a notch higher; the
# same number of settings (4) as the others.
OPSD_TUNE = tuple((("optim.lr", lr),) for lr in (1e-3, 2e-3, 4e-3, 8e-3))
# The fork-native mechanisms (agents/rollout/branching.py): forks after tool results, variance-
# targeted expansion with restarts at failure elsewhere (after_tool is pivot+restart on an env
# without tools), and sibling branches that begin with different moves.
FORK = (("sampler.expansion", "after_tool"), ("sampler.distinct", 1))

METHODS = {
    "grpo": Method("grpo", "grpo", tune=PG_TUNE),
    "tree-grpo": Method("tree-grpo", "tree-grpo", tune=PG_TUNE),
    "treeopsd": Method("treeopsd", "treeopsd", tune=OPSD_TUNE),
    "fork": Method("fork", "tree-grpo", FORK, tune=PG_TUNE),
    "treeopsd+fork": Method("treeopsd+fork", "treeopsd", FORK, tune=OPSD_TUNE),
    # TreeOPSD whose sibling branches begin with different moves (the reference's expansion): the
    # combination that the tuning-seed pilots of docs/study.md picked among five.
    "treeopsd+distinct": Method("treeopsd+distinct", "treeopsd", (("sampler.distinct", 1),), tune=OPSD_TUNE),
    # Branch where a prompt's outcomes differ, fresh chains where they agree (the held-out study's
    # candidates; agents/rollout/branching.py:adaptive).
    "adaptive": Method("adaptive", "tree-grpo", (("sampler.expansion", "adaptive"),), tune=PG_TUNE),
    "treeopsd+adaptive": Method("treeopsd+adaptive", "treeopsd", (("sampler.expansion", "adaptive"),), tune=OPSD_TUNE),
    # The improved forms: the mechanisms that won the ablations (see ``improved_methods``);
    # without ablations (``--quick``), the winners of the full study of benchmarks/results/study.
    "tree-grpo+": Method("tree-grpo+", "tree-grpo", (("sampler.expansion", "mixed"), ("advantage.prefix_credit", "per_leaf"),
                                                      ("sampler.expand_nodes", 1), ("sampler.rounds", 2)), tune=PG_TUNE),
    "treeopsd+": Method("treeopsd+", "treeopsd", (("sampler.expansion", "mixed"), ("sampler.expand_nodes", 1),
                                                  ("sampler.rounds", 2), ("advantage.opsd_fallback", True)), tune=OPSD_TUNE),
}

# Mechanism ablations: each is Tree-GRPO or TreeOPSD with one change, at the reference's lr.
ABLATIONS = {
    # Each fork-native rule alone, and TreeOPSD's credit alone (no outcome blend).
    "tree-grpo/pivot": Method("tree-grpo/pivot", "tree-grpo", (("sampler.expansion", "pivot"),)),
    "tree-grpo/restart": Method("tree-grpo/restart", "tree-grpo", (("sampler.expansion", "restart"),)),
    "tree-grpo/pivot+restart": Method("tree-grpo/pivot+restart", "tree-grpo", (("sampler.expansion", "pivot+restart"),)),
    "tree-grpo/after_tool": Method("tree-grpo/after_tool", "tree-grpo", (("sampler.expansion", "after_tool"),)),
    "tree-grpo/distinct": Method("tree-grpo/distinct", "tree-grpo", (("sampler.distinct", 1),)),
    "treeopsd/credit-only": Method("treeopsd/credit-only", "treeopsd", (("advantage.opsd_lambda", 1.0),)),
    **{f"tree-grpo/{e}": Method(f"tree-grpo/{e}", "tree-grpo", (("sampler.expansion", e),))
       for e in ("with_replacement", "without_replacement", "no_root", "mixed", "entropy", "depth")},
    "tree-grpo/per_turn": Method("tree-grpo/per_turn", "tree-grpo", (("advantage.prefix_credit", "per_turn"),)),
    "tree-grpo/intra": Method("tree-grpo/intra", "tree-grpo", (("advantage.tree_mode", "intra"),)),
    "tree-grpo/n4": Method("tree-grpo/n4", "tree-grpo", (("sampler.expand_nodes", 4), ("sampler.leaves", 5))),
    "tree-grpo/l2": Method("tree-grpo/l2", "tree-grpo", (("sampler.expand_nodes", 1), ("sampler.rounds", 2))),
    "treeopsd/tree-root": Method("treeopsd/tree-root", "treeopsd"),
    "treeopsd/prompt-root": Method("treeopsd/prompt-root", "treeopsd", (("advantage.opsd_root", "prompt"),)),
    "treeopsd/fallback": Method("treeopsd/fallback", "treeopsd", (("advantage.opsd_fallback", True),)),
    "treeopsd/prompt-root+fallback": Method("treeopsd/prompt-root+fallback", "treeopsd",
                                            (("advantage.opsd_root", "prompt"), ("advantage.opsd_fallback", True))),
    "treeopsd/normalized": Method("treeopsd/normalized", "treeopsd", (("advantage.normalize_std", True),)),
}


@dataclass(frozen=True)
class Grid:
    """The whole study: which tasks, methods, budgets and seeds, for each phase."""

    tasks: tuple[str, ...] = ("lock", "maze", "lock-L32", "lookup-when")
    methods: tuple[str, ...] = ("grpo", "treeopsd", "fork", "treeopsd+distinct")
    budgets: tuple[int, ...] = (2, 4)
    seeds: tuple[int, ...] = tuple(range(16))
    tune_seeds: tuple[int, ...] = (1000, 1001, 1002, 1003, 1004)
    tune_budget: int = 4
    ablations: tuple[str, ...] = ("tree-grpo/with_replacement", "tree-grpo/pivot", "tree-grpo/restart",
                                  "tree-grpo/pivot+restart", "tree-grpo/distinct", "treeopsd/credit-only")
    ablation_seeds: tuple[int, ...] = tuple(range(2000, 2008))
    ablation_budget: int = 4
    ablation_tasks: tuple[str, ...] = ("maze",)
    eval_n: int = 64
    evals: int = 1  # held-out evaluations during a report run, besides before and after
    extra_tasks: tuple[str, ...] = ()  # report-only tasks (e.g. turn length), at tune_budget

    def tuning_runs(self, methods: dict[str, Method]) -> list[RunSpec]:
        return [RunSpec("tune", TASKS[t], methods[m], self.tune_budget, s, setting, self.eval_n, evals=0)
                for t in self.tasks for m in self.methods if m in methods
                for setting in methods[m].tune for s in self.tune_seeds]

    def ablation_runs(self, lr_of: dict[str, dict[str, Any]]) -> list[RunSpec]:
        """Each ablation at the tuned setting of its algorithm's method in the grid (Tree-GRPO's
        ablations at ``fork``'s when the reference itself is not tuned)."""
        out = []
        for t in (t for t in self.tasks if t in self.ablation_tasks):
            for name in self.ablations:
                method = ABLATIONS[name]
                base = next((b for b in (method.algo, "fork") if b in lr_of.get(t, {})), method.algo)
                setting = tuple(lr_of.get(t, {}).get(base, {}).items())
                out += [RunSpec("ablate", TASKS[t], method, self.ablation_budget, s, setting, self.eval_n, evals=0)
                        for s in self.ablation_seeds]
        return out

    def report_runs(self, tuned: dict[str, dict[str, Any]], methods: dict[str, Method]) -> list[RunSpec]:
        out = []
        for t in (*self.tasks, *self.extra_tasks):
            budgets = self.budgets if t in self.tasks else (self.tune_budget,)
            base_task = t if t in self.tasks else self.tasks[0]
            for m in self.methods:
                setting = tuple(tuned.get(base_task, {}).get(m, {}).items())
                out += [RunSpec("report", TASKS[t], methods[m], b, s, setting, self.eval_n, self.evals)
                        for b in budgets for s in self.seeds]
        return out


def quick_grid() -> Grid:
    """``--quick``: the sparse probes, the three algorithms' reference and improved forms,
    the scarce budgets only, fewer seeds and settings; a few minutes on 2 cores."""
    return Grid(tasks=("maze",), methods=("grpo", "fork"), budgets=(4,),
                seeds=tuple(range(6)), tune_seeds=(1000,), ablations=(), eval_n=32, extra_tasks=())


def improved_methods(ablations: list[dict[str, Any]]) -> dict[str, Method]:
    """``tree-grpo+`` and ``treeopsd+`` built from the ablations' winners (ablation seeds only).

    tree-grpo+: the expansion rule, the prefix credit and the tree shape with the best mean
    held-out success over the ablation tasks; treeopsd+: the best TreeOPSD credit shape, with
    that expansion and shape. Shapes compete only with shapes of the same cost per prompt
    (n=2 x l=1 against n=1 x l=2), so that B keeps its meaning; n=4 is reported, not chosen.
    Without ablation records, the fixed fallbacks in ``METHODS``.
    """
    import statistics

    score: dict[str, list[float]] = {}
    for r in ablations:
        if "error" not in r and r.get("success_t1") is not None:
            score.setdefault(r["method"], []).append(r["success_t1"])
    if not score:
        return {"tree-grpo+": METHODS["tree-grpo+"], "treeopsd+": METHODS["treeopsd+"]}

    def best(names: list[str]) -> str:
        have = [n for n in names if n in score] or names[:1]  # an ablation not run: the first (reference)
        return max(have, key=lambda n: statistics.fmean(score.get(n, [0.0])))

    expansions = [f"tree-grpo/{e}" for e in ("with_replacement", "without_replacement", "no_root", "mixed", "entropy", "depth")]
    expansion = best(expansions).split("/", 1)[1]
    credit = "per_turn" if best(["tree-grpo/with_replacement", "tree-grpo/per_turn"]) == "tree-grpo/per_turn" else "per_leaf"
    shape = ABLATIONS["tree-grpo/l2"].overrides if best(["tree-grpo/with_replacement", "tree-grpo/l2"]) == "tree-grpo/l2" else ()
    opsd = best(["treeopsd/tree-root", "treeopsd/prompt-root", "treeopsd/fallback", "treeopsd/prompt-root+fallback",
                 "treeopsd/normalized"])
    return {
        "tree-grpo+": Method("tree-grpo+", "tree-grpo", (("sampler.expansion", expansion),
                                                          ("advantage.prefix_credit", credit), *shape), tune=PG_TUNE),
        "treeopsd+": Method("treeopsd+", "treeopsd", (("sampler.expansion", expansion), *shape,
                                                      *ABLATIONS[opsd].overrides), tune=OPSD_TUNE),
    }
