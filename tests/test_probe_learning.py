"""Each algorithm learns the sparse probe: held-out success rises well above the format prior's."""

from __future__ import annotations

import pytest

from treegym.study.grid import Method, RunSpec, Task
from treegym.study.run import run_one

# A two-turn lock with two choices and 2-token turns: the prior succeeds 1 time in 4, and
# the reward comes only at the end of the episode.
LOCK = Task("lock-test", "ProbeLock-v0", horizon=2, choices=2, turn_tokens=2, chains=160)
SETTINGS = {
    "grpo": (("optim.lr", 3e-3),),
    "tree-grpo": (("optim.lr", 3e-3),),
    "treeopsd": (("optim.lr", 1e-2), ("loss.beta", 0.5), ("loss.eps", 1.0)),
}
# TreeOPSD as it ships (beta, eps, lambda and the expansion rule at their defaults): only the learning
# rate is set, since the default (2e-5) is SmolLM2's scale, not a 2-layer probe model's.
DEFAULTS = {"treeopsd-defaults": ("treeopsd", (("optim.lr", 1e-2),)),
            "fork": ("tree-grpo", (("optim.lr", 3e-3), ("sampler.expansion", "pivot+restart"), ("sampler.distinct", 1)))}


@pytest.mark.parametrize("name", [*SETTINGS, *DEFAULTS])
def test_each_algorithm_learns_the_sparse_lock(name: str, tmp_path) -> None:
    algo, setting = DEFAULTS.get(name, (name, SETTINGS.get(name, ())))
    spec = RunSpec("test", LOCK, Method(name, algo), budget=4, seed=0, setting=setting, eval_n=64, evals=1)
    r = run_one(spec, str(tmp_path))
    assert "error" not in r, r.get("trace")
    assert r["success_before_t1"] < 0.45
    assert r["success_t1"] > 0.8, r["curve"]
    # Forced-distinct siblings (sampler.distinct) make one of two siblings at each fork take the other
    # move on a 2-choice lock, so the training reward of a learned policy stays near half at forks:
    # it must still rise, by less. Held-out success above is the claim that it learned.
    rise = 0.1 if dict(setting).get("sampler.distinct") else 0.3
    assert r["reward_last"] > r["reward_first"] + rise
