"""V-trace against the paper's definition (Espeholt et al., 2018, eq. 1), by hand and as its
explicit sum; with pi == mu it is the n-step bootstrapped return; and it equals TorchRL's
``vtrace_advantage_estimate`` on identical inputs in float64, where a planted error shows."""

from __future__ import annotations

import pytest
import torch

from rlloop.data.returns import gae
from rlloop.losses import vtrace as vtrace_module
from rlloop.losses.vtrace import VTrace, vtrace

F64 = torch.float64


def _column(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=F64).unsqueeze(1)  # [T, 1]


def test_two_steps_by_hand() -> None:
    """gamma 0.5; pi/mu = 2 then 0.5 (the 2 clipped to 1 in rho and c); V = 1, 2, then 4
    where the fragment stops. delta_1 = 0.5 (2 + 0.5*4 - 2) = 1, v_1 = 2 + 1 = 3;
    delta_0 = 1 (1 + 0.5*2 - 1) = 1, v_0 = 1 + 1 + 0.5*1*(3 - 2) = 2.5. Advantages:
    A_1 = 0.5 (2 + 0.5*4 - 2) = 1, A_0 = 1 (1 + 0.5*3 - 1) = 1.5."""
    no = torch.zeros((2, 1), dtype=torch.bool)
    out = vtrace(_column(2.0, 0.5).log(), _column(0.0, 0.0), _column(1.0, 2.0),
                 _column(1.0, 2.0), _column(2.0, 4.0), no, no, gamma=0.5)
    torch.testing.assert_close(out.targets, _column(2.5, 3.0), rtol=0, atol=1e-12)
    torch.testing.assert_close(out.advantages, _column(1.5, 1.0), rtol=0, atol=1e-12)


def test_an_episode_end_cuts_the_trace_by_hand() -> None:
    """Step 0 terminates (its next value does not count), step 1 is truncated (bootstraps
    from the final observation's 10), all ratios 1, gamma 0.5: v_1 = 3 + 0.5*10 = 8,
    v_0 = r_0 = 1 (nothing flows back across the end)."""
    out = vtrace(_column(0.0, 0.0), _column(0.0, 0.0), _column(1.0, 3.0), _column(4.0, 6.0),
                 _column(99.0, 10.0), _column(True, False).bool(),
                 _column(False, True).bool(), gamma=0.5)
    torch.testing.assert_close(out.targets, _column(1.0, 8.0), rtol=0, atol=1e-12)
    torch.testing.assert_close(out.advantages, _column(1.0 - 4.0, 8.0 - 6.0), rtol=0,
                               atol=1e-12)


def _paper_sum(log_pi, log_mu, rewards, values, next_values, terminated, truncated, gamma,
               rho_bar, c_bar) -> VTrace:
    """The paper's eq. 1 as written: v_s = V(x_s) + sum_{t=s}^{end} gamma^{t-s}
    (prod_{i=s}^{t-1} c_i) delta_t, the sum stopping at the episode's or fragment's end."""
    ratio = (log_pi - log_mu).exp()
    rho, c = ratio.clamp(max=rho_bar), ratio.clamp(max=c_bar)
    big_t, n = rewards.shape
    delta = rho * (rewards + gamma * (~terminated).to(F64) * next_values - values)
    targets = values.clone()
    for e in range(n):
        for s in range(big_t):
            weight = 1.0
            for t in range(s, big_t):
                targets[s, e] += gamma ** (t - s) * weight * delta[t, e]
                if terminated[t, e] or truncated[t, e]:
                    break
                weight *= float(c[t, e])
    adv = torch.empty_like(values)
    for e in range(n):
        for s in range(big_t):
            end = bool(terminated[s, e] or truncated[s, e]) or s == big_t - 1
            nxt = next_values[s, e] if end else targets[s + 1, e]
            adv[s, e] = rho[s, e] * (rewards[s, e] + gamma * float(~terminated[s, e]) * nxt
                                     - values[s, e])
    return VTrace(targets, adv)


def _random_fragment(seed: int, big_t: int = 12, n: int = 5):
    g = torch.Generator().manual_seed(seed)
    log_mu = -torch.rand((big_t, n), generator=g, dtype=F64) * 2
    log_pi = log_mu + torch.randn((big_t, n), generator=g, dtype=F64) * 0.7
    rewards = torch.randn((big_t, n), generator=g, dtype=F64)
    values = torch.randn((big_t + 1, n), generator=g, dtype=F64)
    ends = torch.rand((big_t, n), generator=g) < 0.2
    terminated = ends & (torch.rand((big_t, n), generator=g) < 0.5)
    truncated = ends & ~terminated
    final_values = torch.randn((big_t, n), generator=g, dtype=F64)
    # next_values: V(x_{t+1}) within an episode, the final observation's value at its end
    next_values = torch.where(ends, final_values, values[1:])
    return log_pi, log_mu, rewards, values[:-1], next_values, terminated, truncated


@pytest.mark.parametrize("bars", [(1.0, 1.0), (2.0, 0.8), (0.5, 1.5)])
def test_the_recursion_equals_the_papers_sum(bars: tuple[float, float]) -> None:
    args = _random_fragment(1)
    out = vtrace(*args, gamma=0.9, rho_bar=bars[0], c_bar=bars[1])
    ref = _paper_sum(*args, 0.9, *bars)
    torch.testing.assert_close(out.targets, ref.targets, rtol=0, atol=1e-12)
    torch.testing.assert_close(out.advantages, ref.advantages, rtol=0, atol=1e-12)


@pytest.mark.parametrize("bars", [(1.0, 1.0), (3.0, 1.5)])
def test_on_policy_it_is_the_n_step_bootstrapped_return(bars: tuple[float, float]) -> None:
    """pi == mu (no lag), bars >= 1: the targets are the discounted rewards to the end of
    the episode or fragment plus the discounted bootstrap there (GAE with lambda 1), and
    the advantages are the one-step TD errors against the next target."""
    log_pi, _, rewards, values, next_values, terminated, truncated = _random_fragment(2)
    out = vtrace(log_pi, log_pi, rewards, values, next_values, terminated, truncated,
                 gamma=0.97, rho_bar=bars[0], c_bar=bars[1])
    _, returns = gae(rewards, values, next_values, terminated, truncated, 0.97, 1.0)
    torch.testing.assert_close(out.targets, returns, rtol=0, atol=1e-12)
    # by hand: the first env's n-step return from step 0, summed in the other direction
    ends = terminated | truncated
    total, discount = torch.zeros((), dtype=F64), 1.0
    for t in range(len(rewards)):
        total += discount * rewards[t, 0]
        discount *= 0.97
        if ends[t, 0] or t == len(rewards) - 1:
            total += 0 if terminated[t, 0] else discount * next_values[t, 0]
            break
    torch.testing.assert_close(out.targets[0, 0], total, rtol=0, atol=1e-12)


def _torchrl(args, gamma: float, rho_bar: float, c_bar: float) -> VTrace:
    functional = pytest.importorskip("torchrl.objectives.value.functional")
    log_pi, log_mu, rewards, values, next_values, terminated, truncated = args

    def bt(x: torch.Tensor) -> torch.Tensor:  # [T, N] -> TorchRL's [N, T, 1]
        return x.T.unsqueeze(-1)

    # TorchRL makes its discounts as gamma * (an int tensor): in the default dtype
    default = torch.get_default_dtype()
    torch.set_default_dtype(F64)
    try:
        adv, targets = functional.vtrace_advantage_estimate(
            gamma, bt(log_pi), bt(log_mu), bt(values), bt(next_values), bt(rewards),
            bt(terminated | truncated), bt(terminated), rho_thresh=rho_bar, c_thresh=c_bar)
    finally:
        torch.set_default_dtype(default)
    return VTrace(targets.squeeze(-1).T, adv.squeeze(-1).T)


@pytest.mark.parametrize("seed,bars", [(3, (1.0, 1.0)), (4, (1.7, 0.9))])
def test_it_equals_torchrls_vtrace(seed: int, bars: tuple[float, float]) -> None:
    args = _random_fragment(seed)
    ours = vtrace(*args, gamma=0.95, rho_bar=bars[0], c_bar=bars[1])
    theirs = _torchrl(args, 0.95, *bars)
    torch.testing.assert_close(ours.targets, theirs.targets, rtol=0, atol=1e-12)
    torch.testing.assert_close(ours.advantages, theirs.advantages, rtol=0, atol=1e-12)


def test_a_planted_error_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """c clipped at rho_bar instead of c_bar (a classic slip): TorchRL disagrees."""
    real = vtrace_module.vtrace

    def wrong(*args, gamma, rho_bar=1.0, c_bar=1.0):  # type: ignore[no-untyped-def]
        return real(*args, gamma=gamma, rho_bar=rho_bar, c_bar=rho_bar)

    monkeypatch.setattr(vtrace_module, "vtrace", wrong)
    args = _random_fragment(4)
    ours = vtrace_module.vtrace(*args, gamma=0.95, rho_bar=1.7, c_bar=0.9)
    theirs = _torchrl(args, 0.95, 1.7, 0.9)
    assert (ours.targets - theirs.targets).abs().max() > 1e-3
