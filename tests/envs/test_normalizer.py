"""The running statistics behind observation and reward normalisation, pinned by hand."""

from __future__ import annotations

import torch
from torch.testing import assert_close

from rlloop.envs.normalizer import RunningMeanStd
from rlloop.envs.wrappers import discounted_reward_scale


def test_uneven_batches_give_the_statistics_of_all_the_data() -> None:
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(n, 3, generator=g, dtype=torch.float64) * 2 + 5 for n in (1, 7, 30)]
    stats = RunningMeanStd((3,))
    for batch in batches:
        stats.update(batch)
    data = torch.cat(batches)
    # The prior (mean 0, var 1) weighs count=eps: gone to within ~1e-7.
    assert_close(stats.mean, data.mean(0), atol=1e-6, rtol=0)
    assert_close(stats.var, data.var(0, unbiased=False), atol=1e-6, rtol=0)
    assert abs(stats.count - 38) < 1e-6


def test_normalize_centres_scales_and_clips() -> None:
    stats = RunningMeanStd((2,), clip=3.0)
    stats.set_state({"mean": torch.tensor([1.0, -2.0]), "var": torch.tensor([4.0, 0.25]),
                     "count": 10.0})
    x = torch.tensor([[3.0, -2.0], [1.0, 0.0]])
    # (x - mean) / sqrt(var + eps): [[1, 0], [0, 4 -> clipped to 3]]
    assert_close(stats.normalize(x), torch.tensor([[1.0, 0.0], [0.0, 3.0]]), atol=1e-6, rtol=0)


def test_rewards_divide_by_the_std_of_the_discounted_return() -> None:
    rewards = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    dones = torch.tensor([[False, True], [False, False], [False, False]])
    running = torch.zeros(2, dtype=torch.float64)
    stats = RunningMeanStd(())
    scaled = discounted_reward_scale(rewards, dones, running, stats, gamma=0.5)
    # Returns, gamma 0.5: env 0 runs 1, 3.5, 6.75; env 1 ends its episode after 2, then 4, 8.
    returns = torch.tensor([1.0, 2.0, 3.5, 4.0, 6.75, 8.0], dtype=torch.float64)
    assert_close(running, torch.tensor([6.75, 8.0], dtype=torch.float64))
    std = returns.var(unbiased=False).sqrt().float()
    assert_close(scaled, rewards / std, atol=1e-5, rtol=1e-5)
