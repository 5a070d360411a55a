"""Policy losses: hand-computed values, and the autograd properties that tell them apart."""

from __future__ import annotations

import math

import pytest
import torch

from treegym.errors import ConfigError
from treegym.trainers.losses import aggregate, kl_k3, ppo_clip_loss, teacher_ratio, treeopsd_loss


def test_ppo_clip_matches_hand_computed_surrogate() -> None:
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[1.5, 0.9, 1.0]]))
    adv = torch.tensor([[1.0, 1.0, -2.0]])
    out = ppo_clip_loss(logp, old, adv, torch.ones(1, 3), clip=0.2)
    # token 0: min(1.5, 1.2)*1 -> -1.2; token 1: min(.9,.9) -> -.9; token 2: -(-2)*1 = 2
    assert out.loss.item() == pytest.approx((-1.2 - 0.9 + 2.0) / 3, rel=1e-5)
    assert out.metrics["clipfrac"].item() == pytest.approx(1 / 3)


def test_dual_clip_caps_the_loss_of_negative_advantages() -> None:
    logp = torch.tensor([[math.log(10.0)]], requires_grad=True)
    out = ppo_clip_loss(logp, torch.zeros(1, 1), torch.tensor([[-1.0]]), torch.ones(1, 1), dual_clip=3.0)
    assert out.loss.item() == pytest.approx(3.0)  # not 10
    out.loss.backward()
    assert logp.grad.abs().item() == 0.0
    no_dual = ppo_clip_loss(logp.detach(), torch.zeros(1, 1), torch.tensor([[-1.0]]), torch.ones(1, 1), dual_clip=None)
    assert no_dual.loss.item() == pytest.approx(10.0, rel=1e-5)


def test_masked_tokens_contribute_nothing() -> None:
    logp = torch.randn(2, 4, requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]])
    out = ppo_clip_loss(logp, logp.detach(), torch.ones(2, 4), mask)
    out.loss.backward()
    assert (logp.grad[mask == 0] == 0).all() and (logp.grad[mask == 1] != 0).all()


def test_aggregations() -> None:
    v = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    m = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert aggregate(v, m, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate(v, m, "seq-mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate(v, m, "constant", 10.0).item() == pytest.approx(1.0)
    assert aggregate(v, torch.zeros_like(m), "token-mean").item() == 0.0
    with pytest.raises(ConfigError, match="seq-mean"):
        aggregate(v, m, "sum")


def test_k3_kl_is_zero_at_the_reference_and_positive_elsewhere() -> None:
    logp = torch.tensor([-1.0, -2.0])
    assert kl_k3(logp, logp).abs().max() == 0
    d = -0.5
    assert kl_k3(torch.tensor([0.0]), torch.tensor([d])).item() == pytest.approx(math.exp(d) - d - 1)


def test_teacher_ratio_is_bounded_and_one_at_zero_credit() -> None:
    r = teacher_ratio(torch.tensor([0.0, 0.05, 5.0, -5.0]), beta=1.0, eps=0.2)
    assert r.tolist() == pytest.approx([1.0, math.exp(0.05), 1.2, 0.8], rel=1e-6)


def test_loss_keyword_defaults_are_the_configs() -> None:
    import inspect

    from treegym.trainers.algorithms import ALGORITHMS
    from treegym.trainers.config import TrainConfig

    cfg = TrainConfig()
    for algo in ("grpo", "treeopsd"):
        params = inspect.signature(ALGORITHMS[algo].loss).parameters
        for name, value in ALGORITHMS[algo].loss_options(cfg).items():
            if name != "dual_clip":  # the config writes "off" as 0, the loss as None
                assert params[name].default == value, (algo, name)
    assert inspect.signature(teacher_ratio).parameters["eps"].default == cfg.loss.eps


def test_treeopsd_loss_stays_finite_where_the_teacher_ratio_underflows_to_zero() -> None:
    # With ε >= 1 there is no lower clip, and exp(-120) is 0 in float32: r*·log r* is 0·log 0.
    adv = torch.tensor([[-120.0, 0.5]])
    assert teacher_ratio(adv, beta=1.0, eps=1.0)[0, 0] == 0.0
    theta, actions = _policy(2)
    logp = _logp(theta, actions)
    out = treeopsd_loss(logp, logp.detach(), adv, torch.ones(1, 2), beta=1.0, eps=1.0)
    (grad,) = torch.autograd.grad(out.loss, theta)
    assert torch.isfinite(out.loss) and torch.isfinite(grad).all()
    assert all(torch.isfinite(v) for v in out.metrics.values())
    # At r = 1 each token adds r*·log r* - r* + 1: exactly 1 for the token the teacher gives no mass.
    r = math.exp(0.5)
    assert out.loss.item() == pytest.approx((1.0 + (r * 0.5 - r + 1.0)) / 2, rel=1e-5)


def _policy(n: int, vocab: int = 5, seed: int = 0) -> tuple[torch.nn.Parameter, torch.Tensor]:
    # One independent categorical per token position, and one sampled action for each.
    g = torch.Generator().manual_seed(seed)
    theta = torch.nn.Parameter(torch.randn(n, vocab, generator=g) * 0.1)
    actions = torch.randint(vocab, (n,), generator=g)
    return theta, actions


def _logp(theta: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(theta, -1).gather(-1, actions[:, None]).squeeze(-1)[None]


def test_treeopsd_gradient_at_ratio_one_is_the_policy_gradient_direction() -> None:
    theta, actions = _policy(6)
    adv = torch.tensor([[0.3, -0.2, 0.1, -0.05, 0.4, 0.0]])
    mask = torch.ones(1, 6)
    logp = _logp(theta, actions)
    loss = treeopsd_loss(logp, logp.detach(), adv, mask, beta=1.0, eps=10.0).loss
    (g_opsd,) = torch.autograd.grad(loss, theta)
    # Exactly -(r* - 1)·∇log π, token-averaged ...
    target = teacher_ratio(adv, 1.0, 10.0)
    (g_expected,) = torch.autograd.grad(-((target - 1) * _logp(theta, actions)).mean(), theta)
    assert torch.allclose(g_opsd, g_expected, atol=1e-7)
    # ... which is parallel to the policy gradient -A·∇log π when each token has its own
    # parameters (per-row), and close to it overall (exp(A) - 1 ≈ A for small A).
    (g_pg,) = torch.autograd.grad(-(adv * _logp(theta, actions)).mean(), theta)
    for row in range(6):
        if adv[0, row] != 0:
            cos = torch.nn.functional.cosine_similarity(g_opsd[row], g_pg[row], dim=0)
            assert cos.item() == pytest.approx(1.0, abs=1e-6)
    assert torch.nn.functional.cosine_similarity(g_opsd.flatten(), g_pg.flatten(), dim=0) > 0.99


def _train(loss_name: str, adv: torch.Tensor, steps: int) -> torch.Tensor:
    theta, actions = _policy(adv.shape[1], seed=1)
    old = _logp(theta, actions).detach()
    opt = torch.optim.SGD([theta], lr=2.0)
    mask = torch.ones_like(adv)
    for _ in range(steps):
        logp = _logp(theta, actions)
        if loss_name == "treeopsd":
            out = treeopsd_loss(logp, old, adv, mask, beta=1.0, eps=0.2)
        else:
            out = ppo_clip_loss(logp, old, adv, mask, clip=0.2)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    return torch.exp(_logp(theta, actions) - old).detach()[0]


def test_repeated_treeopsd_steps_converge_to_the_target_ratio_and_stop() -> None:
    adv = torch.tensor([[0.1, -0.1, 0.05]])
    target = teacher_ratio(adv, 1.0, 0.2)[0]
    after = _train("treeopsd", adv, 150)
    assert torch.allclose(after, target, atol=1e-3)
    # More epochs on the same batch do not move it: the minimum is at r = r*.
    assert torch.allclose(_train("treeopsd", adv, 300), after, atol=1e-4)


def test_ppo_clip_keeps_pushing_to_its_clip_edge_past_the_target() -> None:
    adv = torch.tensor([[0.1, -0.1, 0.05]])
    target = teacher_ratio(adv, 1.0, 0.2)[0]
    after = _train("ppo", adv, 150)
    # Positive advantages reach 1 + clip, negative ones 1 - clip: beyond r* = exp(±A).
    assert after[0] >= 1.2 - 1e-3 and after[2] >= 1.2 - 1e-3 and after[1] <= 0.8 + 1e-3
    assert (after[0] - target[0]) > 0.05 and (target[1] - after[1]) > 0.05
