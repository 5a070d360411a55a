"""bf16 on a CPU: the update runs under bf16 autocast where the CPU has bf16 matmul units
(``model_opts.cpu_bf16=auto``), with fp32 weights and AdamW state; sampling and held-out evaluation
stay fp32 on a CPU.

The rest of the suite pins fp32 (``TREEGYM_CPU_BF16=off`` in conftest): its exactness checks are
fp32 checks. These tests turn bf16 on themselves.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from test_packing import _batch
from tiny_task import build_tiny_model
from transformers import AutoModelForCausalLM

from treegym.errors import ConfigError
from treegym.paths import cache_dir
from treegym.trainers import parallel
from treegym.trainers import update as upd
from treegym.trainers.config import ModelConfig, load_config
from treegym.trainers.logprobs import TokenScorer

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.fixture(scope="module")
def tiny_model() -> Path:
    return build_tiny_model(cache_dir("test-models") / "tiny-keys-v1")


def _cpuinfo_has_bf16() -> bool | None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    flags = {f for line in text.splitlines() if line.startswith("flags") for f in line.split(":", 1)[1].split()}
    return bool(flags & {"amx_bf16", "avx512_bf16"})


def test_the_probe_finds_the_cpus_bf16_units(monkeypatch: pytest.MonkeyPatch) -> None:
    expected = _cpuinfo_has_bf16()
    if expected is None:
        pytest.skip("no /proc/cpuinfo to compare with")
    monkeypatch.delenv("TREEGYM_CPU_BF16", raising=False)
    assert parallel.cpu_has_bf16() is expected


def test_the_environment_overrides_the_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TREEGYM_CPU_BF16", "on")
    assert parallel.cpu_has_bf16()
    monkeypatch.setenv("TREEGYM_CPU_BF16", "off")
    assert not parallel.cpu_has_bf16()


@pytest.mark.parametrize("setting,units,expected", [("on", False, True), ("off", True, False), ("auto", True, True),
                                                    ("auto", False, False)])
def test_cpu_bf16_decides_the_updates_autocast_and_the_cpu_decoder(monkeypatch: pytest.MonkeyPatch, setting: str,
                                                                 units: bool, expected: bool) -> None:
    monkeypatch.setenv("TREEGYM_CPU_BF16", "on" if units else "off")
    opts = ModelConfig(cpu_bf16=setting)
    assert parallel.train_bf16(CPU, opts) is expected
    assert parallel.generate_bf16(CPU, opts) is False  # no CPU autocast in generation: it re-casts every step
    assert parallel.decode_bf16(CPU, opts) is expected  # the CPU sampler's bf16 decoder follows the update
    assert not parallel.decode_bf16(CUDA, opts)
    # on a GPU, model_opts.bf16 decides both, whatever cpu_bf16 says
    assert parallel.train_bf16(CUDA, opts) and parallel.generate_bf16(CUDA, opts)
    assert not parallel.train_bf16(CUDA, dataclasses.replace(opts, bf16=False))


def test_the_optimizer_is_fused_adamw_for_plain_cpu_weights() -> None:
    layer = torch.nn.Linear(4, 3)
    opt = parallel.adamw(list(layer.parameters()), lr=1e-2, weight_decay=0.1)
    assert opt.defaults["fused"] is True
    reference = torch.optim.AdamW(torch.nn.Linear(4, 3).parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
    twin = reference.param_groups[0]["params"]
    with torch.no_grad():
        for a, b in zip(twin, layer.parameters()):
            a.copy_(b)
    x = torch.randn(5, 4)
    for optimizer, params in ((opt, list(layer.parameters())), (reference, twin)):
        for _ in range(3):
            optimizer.zero_grad()
            (torch.nn.functional.linear(x, params[0], params[1]) ** 2).sum().backward()
            optimizer.step()
    for a, b in zip(twin, layer.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)  # the same AdamW, one pass per tensor


def test_a_bad_cpu_bf16_value_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="cpu_bf16"):
        load_config(overrides=[("model_opts.cpu_bf16", "maybe")])


def test_a_bf16_update_scores_in_bf16_and_steps_fp32_weights(tiny_model: Path) -> None:
    """Under cpu_bf16=on the scorer's log-probs move off the fp32 ones by bf16 rounding only, and the
    update steps fp32 weights (and AdamW state) to a place near the fp32 update's."""
    cfg, algorithm, data, rollouts = _batch("tree-grpo", tiny_model, seed=3)
    trees = [r.prompt_index * 100_000 + r.tree_index for r in rollouts]
    results = {}
    for setting in ("off", "on"):
        c = dataclasses.replace(cfg, model_opts=dataclasses.replace(cfg.model_opts, cpu_bf16=setting),
                                optim=dataclasses.replace(cfg.optim, lr=1e-3))
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
        scorer = TokenScorer(model)
        logp = upd.score(scorer, data, c, CPU)
        params = [p for p in model.parameters() if p.requires_grad]
        before = torch.cat([p.detach().flatten() for p in params]).clone()
        optimizer = torch.optim.AdamW(params, lr=1e-3)
        u = upd.Update(scorer, optimizer, params, algorithm.loss, algorithm.loss_options(c), c, parallel.Dist(), CPU)
        order = list(range(len(rollouts)))
        stats, bad = upd.update(u, data, torch.zeros_like(data.mask), None, order, -(-len(order) // 6), trees)
        assert not bad and all(torch.isfinite(torch.tensor(v)).all() for v in stats.values())
        assert all(p.dtype == torch.float32 for p in model.parameters())
        assert all(s.dtype == torch.float32 for st in optimizer.state.values() for s in st.values() if s.dim())
        after = torch.cat([p.detach().flatten() for p in params])
        results[setting] = (logp, after - before)
    mask = data.mask.bool()
    diff = (results["on"][0] - results["off"][0]).abs()[mask]
    assert float(diff.max()) > 0  # autocast really ran in bf16
    assert float(diff.mean()) < 0.05  # and only rounded
    step32, step16 = results["off"][1], results["on"][1]
    assert float(step16.abs().max()) > 0
    assert float(torch.nn.functional.cosine_similarity(step16, step32, dim=0)) > 0.9
