"""PPO loss pieces on a hand-computed batch."""

import math

import torch

from rlloop.losses.ppo import PPOLossConfig, ppo_loss


def _batch(**over):
    b = dict(
        log_prob=torch.log(torch.tensor([1.5, 0.5])),
        old_log_prob=torch.zeros(2),
        advantages=torch.tensor([1.0, -1.0]),
        values=torch.tensor([1.0, 2.0]),
        old_values=torch.zeros(2),
        returns=torch.zeros(2),
        entropy=torch.tensor([0.3, 0.5]),
    )
    b.update(over)
    return b


def test_clipped_surrogate_and_stats():
    cfg = PPOLossConfig(clip_coef=0.2, vf_coef=0.0, ent_coef=0.0, normalize_advantages=False)
    loss, stats = ppo_loss(cfg=cfg, **_batch())
    # sample 0: min(1.5 * 1, 1.2 * 1) = 1.2; sample 1: min(0.5 * -1, 0.8 * -1) = -0.8
    assert math.isclose(float(stats["losses/policy"]), -(1.2 - 0.8) / 2, rel_tol=1e-6)
    assert math.isclose(float(loss), -0.2, rel_tol=1e-6)
    assert float(stats["ppo/clip_fraction"]) == 1.0
    kl = ((0.5 - math.log(1.5)) + (-0.5 - math.log(0.5))) / 2
    assert math.isclose(float(stats["ppo/approx_kl"]), kl, rel_tol=1e-6)


def test_value_loss_plain_and_clipped():
    cfg = PPOLossConfig(vf_coef=1.0, normalize_advantages=False)
    _, stats = ppo_loss(cfg=cfg, **_batch())
    assert math.isclose(float(stats["losses/value"]), 0.5 * (1 + 4) / 2, rel_tol=1e-6)
    clipped = PPOLossConfig(vf_coef=1.0, clip_vf=0.5, normalize_advantages=False)
    b = _batch(returns=torch.tensor([1.0, 2.0]))
    _, stats = ppo_loss(cfg=clipped, **b)
    # new values hit the returns, but the clipped values (0.5, 0.5) miss: max wins.
    assert math.isclose(float(stats["losses/value"]), 0.5 * (0.25 + 2.25) / 2, rel_tol=1e-6)


def test_entropy_bonus_and_total():
    cfg = PPOLossConfig(clip_coef=0.2, vf_coef=0.5, ent_coef=0.1, normalize_advantages=False)
    loss, stats = ppo_loss(cfg=cfg, **_batch())
    expected = -0.2 + 0.5 * 1.25 - 0.1 * 0.4
    assert math.isclose(float(loss), expected, rel_tol=1e-6)
    assert math.isclose(float(stats["losses/entropy"]), 0.4, rel_tol=1e-6)


def test_advantage_normalisation_and_gradient_of_unclipped_sample():
    cfg = PPOLossConfig(clip_coef=10.0, vf_coef=0.0, normalize_advantages=True)
    lp = torch.zeros(2, requires_grad=True)
    loss, _ = ppo_loss(lp, torch.zeros(2), torch.tensor([3.0, 1.0]), torch.zeros(2),
                       torch.zeros(2), torch.zeros(2), torch.zeros(2), cfg)
    loss.backward()
    # normalised advantages are +-1/sqrt(2) * sqrt(2) = +-0.7071 (unbiased std);
    # d(-mean(r * A))/d log_prob = -A / B at ratio 1.
    a = torch.tensor([1.0, -1.0]) / torch.tensor([2.0, 0.0]).std()
    torch.testing.assert_close(lp.grad, -a / 2, rtol=1e-4, atol=1e-6)
