"""CQL's and IQL's losses equal TorchRL's own ``CQLLoss`` and ``IQLLoss`` (torchrl 0.14) on
identical networks and inputs, in float64; each comparison catches a planted error.

The networks are rlloop's (the offline learners' modules), copied into TorchRL's modules:
the twin critics member by member, the policies as TorchRL distributions over the same
parameters. TorchRL draws its random actions and noise from torch's global RNG, in an
order these tests replay with the same seed.

Where the parametrisations differ the comparison says so:

* TorchRL's CQL penalty takes its log-sum-exp over the three sources of each sampled
  action, the paper's (and rlloop's) over all ``3N`` actions of a state: with ``N = 1``
  they coincide, so TorchRL is compared there and ``N > 1`` against hand-computed values.
* TorchRL's CQL scores the policy's next-state actions at the next state, the authors'
  code (and rlloop's learner) at the current one: the pure penalty function takes the
  Q-values, so it is compared on TorchRL's choice here.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from rlloop.config.offline import CQLConfig, IQLConfig
from rlloop.losses import offline as losses
from rlloop.losses.sac import sac_actor_loss, sac_alpha_loss, sac_target
from rlloop.modules.q_networks import TwinQ

torchrl = pytest.importorskip("torchrl")
tensordict = pytest.importorskip("tensordict")
from tensordict import TensorDict  # noqa: E402
from tensordict.nn import TensorDictModule  # noqa: E402
from torchrl.modules import ProbabilisticActor  # noqa: E402
from torchrl.modules.distributions import IndependentNormal, TanhNormal  # noqa: E402
from torchrl.objectives import CQLLoss, IQLLoss  # noqa: E402

B, OBS, ACT = 6, 3, 2
GAMMA = 0.75  # exact in float32, which TorchRL keeps gamma in


class _Member(nn.Module):
    """One critic of a :class:`TwinQ` as a plain module ``Q(obs, action) -> [B, 1]``."""

    def __init__(self, twin: TwinQ, i: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for k, (w, b) in enumerate(zip(twin.weights, twin.biases, strict=True)):
            lin = nn.Linear(w.shape[1], w.shape[2], dtype=torch.float64)
            with torch.no_grad():
                lin.weight.copy_(w[i].t())
                lin.bias.copy_(b[i, 0])
            layers += [lin] + ([nn.ReLU()] if k < len(twin.weights) - 1 else [])
        self.net = nn.Sequential(*layers)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([obs, action], -1))


def _critics(twin: TwinQ) -> list[TensorDictModule]:
    return [TensorDictModule(_Member(twin, i), in_keys=["observation", "action"],
                             out_keys=["state_action_value"]) for i in range(2)]


def _batch(seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    f = {"dtype": torch.float64, "generator": g}
    term = torch.tensor([False, True, False, False, True, False])
    return TensorDict({
        "observation": torch.randn(B, OBS, **f), "action": torch.rand(B, ACT, **f) * 1.8 - 0.9,
        "next": {"observation": torch.randn(B, OBS, **f), "reward": torch.randn(B, 1, **f),
                 "done": term[:, None], "terminated": term[:, None]}}, batch_size=[B])


# ---------------------------------------------------------------------------- IQL


def _iql_nets():
    from rlloop.algorithms.iql import IQLModule

    torch.manual_seed(1)
    m = IQLModule(OBS, ACT, IQLConfig(dataset="-", hidden=[16, 16])).double()
    with torch.no_grad():
        m.actor.log_std.copy_(torch.tensor([-0.3, 0.2]))
    return m


class _IQLPolicy(nn.Module):
    def __init__(self, m) -> None:
        super().__init__()
        self.actor = m.actor

    def forward(self, obs):
        loc = self.actor.mode(obs)
        return loc, self.actor.std().expand_as(loc)


class _Value(nn.Module):
    def __init__(self, m) -> None:
        super().__init__()
        self.m = m.value

    def forward(self, obs):
        return self.m(obs)


def _rlloop_iql(m, td, cfg, plant: str = ""):
    obs, act = td["observation"], td["action"]
    nxt = td["next"]
    q_target = m.critic_target(obs, act)
    value = m.v(obs)
    expectile = 1 - cfg.expectile if plant == "expectile" else cfg.expectile
    value_loss, _ = losses.iql_value_loss(q_target, value, expectile)
    next_v = m.v(nxt["observation"])
    terminated = nxt["terminated"][:, 0]
    if plant == "done":
        terminated = torch.zeros_like(terminated)
    critic_loss, _ = losses.iql_critic_loss(m.critic(obs, act), nxt["reward"][:, 0],
                                            torch.full((B,), GAMMA, dtype=torch.float64),
                                            terminated, next_v)
    temperature = cfg.temperature * (2 if plant == "temperature" else 1)
    actor_loss, _ = losses.iql_actor_loss(m.actor.log_prob(obs, act), q_target, value,
                                          temperature, cfg.max_weight)
    return value_loss, critic_loss, actor_loss


def _torchrl_iql(m, td, cfg):
    actor = ProbabilisticActor(
        TensorDictModule(_IQLPolicy(m), in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"], distribution_class=IndependentNormal,
        distribution_kwargs={"tanh_loc": False})
    value = TensorDictModule(_Value(m), in_keys=["observation"], out_keys=["state_value"])
    loss = IQLLoss(actor, _critics(m.critic), value, loss_function="l2",
                   temperature=cfg.temperature, expectile=cfg.expectile)
    loss.make_value_estimator(gamma=GAMMA)
    out = loss(td.clone())
    return out["loss_value"], out["loss_qvalue"], out["loss_actor"]


@pytest.mark.parametrize("plant", ["", "expectile", "done", "temperature"])
def test_iql_losses_equal_torchrl(plant: str) -> None:
    m, td = _iql_nets(), _batch()
    cfg = IQLConfig(dataset="-", expectile=0.7, temperature=3.0)
    ours = _rlloop_iql(m, td, cfg, plant)
    theirs = _torchrl_iql(m, td, cfg)
    same = [torch.allclose(a, b, rtol=1e-10, atol=1e-12) for a, b in zip(ours, theirs,
                                                                         strict=True)]
    assert all(same) == (not plant), (plant, ours, theirs)


def test_iql_expectile_loss_by_hand() -> None:
    diff = torch.tensor([2.0, -1.0], dtype=torch.float64)
    # 0.8 * 4 and 0.2 * 1, averaged
    assert losses.expectile_loss(diff, 0.8).item() == pytest.approx((3.2 + 0.2) / 2)


# ---------------------------------------------------------------------------- CQL


def _cql_nets():
    from rlloop.algorithms.cql import CQLModule

    torch.manual_seed(2)
    # alpha 1: TorchRL keeps log alpha in float32, where log 1 alone is exact.
    return CQLModule(OBS, ACT, CQLConfig(dataset="-", hidden=[16, 16], init_alpha=1.0)).double()


class _CQLPolicy(nn.Module):
    """rlloop's tanh-Gaussian actor as TorchRL's ``TanhNormal`` parameters."""

    def __init__(self, m) -> None:
        super().__init__()
        self.actor = m.actor

    def forward(self, obs):
        mean, raw = self.actor.net(obs).chunk(2, -1)
        return mean, raw.clamp(-20.0, 2.0).exp()


def _torchrl_cql(m, td, weight: float, temperature: float):
    actor = ProbabilisticActor(
        TensorDictModule(_CQLPolicy(m), in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"], distribution_class=TanhNormal,
        distribution_kwargs={"low": -1.0, "high": 1.0, "tanh_loc": False},
        return_log_prob=True)
    loss = CQLLoss(actor, _critics(m.critic), loss_function="l2", alpha_init=1.0,
                   target_entropy=-float(ACT), deterministic_backup=False, num_random=1,
                   min_q_weight=weight, temperature=temperature, with_lagrange=False)
    loss.make_value_estimator(gamma=GAMMA)
    torch.manual_seed(123)
    out = loss(td.clone())
    return {k: out[k] for k in ("loss_qvalue", "loss_cql", "loss_actor", "loss_alpha")}


def _rlloop_cql(m, td, weight: float, temperature: float, plant: str = ""):
    """The same losses, with TorchRL's draws replayed from the same seed: the next-state
    action, the penalty's uniform, current and next-state actions, TorchRL's BC term's
    sample (unused here), the actor's."""
    obs, act, nxt = td["observation"], td["action"], td["next"]
    torch.manual_seed(123)
    eps_next = torch.randn(B, ACT, dtype=torch.float64)
    uniform = torch.empty(B, ACT, dtype=torch.float64).uniform_(-1, 1)
    eps_pi, eps_next_pi = (torch.randn(B, ACT, dtype=torch.float64) for _ in range(2))
    torch.randn(B, ACT, dtype=torch.float64)  # TorchRL's actor_bc_loss sample
    eps_actor = torch.randn(B, ACT, dtype=torch.float64)
    alpha = m.log_alpha.detach().exp()
    with torch.no_grad():
        a2, logp2 = m.actor(nxt["observation"], noise=eps_next)
        q2 = m.critic_target(nxt["observation"], a2)
        target = sac_target(nxt["reward"][:, 0], torch.full((B,), GAMMA, dtype=torch.float64),
                            nxt["terminated"][:, 0], q2[0], q2[1], logp2, alpha)
        pi, logp_pi = m.actor(obs, noise=eps_pi)
        npi, logp_npi = m.actor(nxt["observation"], noise=eps_next_pi)
    q = m.critic(obs, act)
    td_loss, _ = losses.td_loss(q, target)
    scale = 0.5 if plant == "half_td" else 1.0
    # TorchRL's choice: next-state actions scored at the next state (see the docstring).
    q_next_pi = m.critic(nxt["observation"] if plant != "next_at_s" else obs, npi)
    penalty, _ = losses.cql_penalty(
        q, m.critic(obs, uniform)[..., None], m.critic(obs, pi)[..., None], logp_pi[:, None],
        q_next_pi[..., None], logp_npi[:, None], ACT if plant != "density" else ACT + 1,
        weight, temperature)
    action, log_prob = m.actor(obs, noise=eps_actor)
    q_pi = m.critic(obs, action, detach_params=True)
    actor_loss, _ = sac_actor_loss(q_pi[0], q_pi[1], log_prob, alpha)
    alpha_loss, _ = sac_alpha_loss(m.log_alpha, log_prob, -float(ACT))
    return {"loss_qvalue": scale * td_loss, "loss_cql": penalty, "loss_actor": actor_loss,
            "loss_alpha": alpha_loss}


@pytest.mark.parametrize("plant", ["", "half_td", "next_at_s", "density"])
def test_cql_losses_equal_torchrl_with_one_sampled_action(plant: str) -> None:
    m, td = _cql_nets(), _batch(1)
    theirs = _torchrl_cql(m, td, weight=2.0, temperature=1.5)
    ours = _rlloop_cql(m, td, weight=2.0, temperature=1.5, plant=plant)
    same = {k: torch.allclose(ours[k], theirs[k], rtol=1e-9, atol=1e-10) for k in ours}
    assert all(same.values()) == (not plant), (plant, same, ours, theirs)


def test_cql_penalty_over_all_sampled_actions_by_hand() -> None:
    """``N = 2``: the log-sum-exp runs over the 6 actions of each state."""
    q_data = torch.tensor([[1.0], [2.0]], dtype=torch.float64)  # 2 critics, 1 state
    q_rand = torch.tensor([[[0.5, 0.1]], [[0.2, 0.3]]], dtype=torch.float64)
    q_pi = torch.tensor([[[1.0, 0.0]], [[0.4, 0.9]]], dtype=torch.float64)
    q_next = torch.tensor([[[0.3, 0.7]], [[1.1, -0.2]]], dtype=torch.float64)
    log_pi = torch.tensor([[-1.0, -0.5]], dtype=torch.float64)
    next_log_pi = torch.tensor([[-0.2, -2.0]], dtype=torch.float64)
    t, w, d = 2.0, 3.0, 1
    expected = 0.0
    for c in range(2):
        scores = ([q_rand[c, 0, j].item() - d * math.log(0.5) for j in range(2)]
                  + [q_pi[c, 0, j].item() - log_pi[0, j].item() for j in range(2)]
                  + [q_next[c, 0, j].item() - next_log_pi[0, j].item() for j in range(2)])
        lse = t * math.log(sum(math.exp(s / t) for s in scores))
        expected += w * (lse - q_data[c, 0].item())
    penalty, _ = losses.cql_penalty(q_data, q_rand, q_pi, log_pi, q_next, next_log_pi, d, w, t)
    assert penalty.item() == pytest.approx(expected, rel=1e-12)
    # the planted error: a log-sum-exp per sampled action (TorchRL's) gives another value
    per_draw = losses.cql_penalty(q_data[:, :, None].expand(2, 1, 2).reshape(2, 2),
                                  q_rand.reshape(2, 2, 1), q_pi.reshape(2, 2, 1),
                                  log_pi.reshape(2, 1), q_next.reshape(2, 2, 1),
                                  next_log_pi.reshape(2, 1), d, w, t)[0]
    assert per_draw.item() != pytest.approx(expected, rel=1e-6)


def test_the_iql_learners_update_loss_is_torchrls_three_summed() -> None:
    """The learner wires the pure losses as TorchRL does: its one loss is their sum."""
    from rlloop.algorithms.iql import IQLLearner
    from rlloop.data.transitions import Transitions
    from rlloop.learners.learner import DEFAULT_MODULE_ID

    m, td = _iql_nets(), _batch()
    cfg = IQLConfig(dataset="-", expectile=0.7, temperature=3.0)
    nxt = td["next"]
    batch = Transitions(td["observation"], td["action"], nxt["reward"][:, 0],
                        nxt["observation"], nxt["terminated"][:, 0],
                        torch.full((B,), GAMMA, dtype=torch.float64))
    loss, _ = IQLLearner({DEFAULT_MODULE_ID: m}, cfg).compute_loss_for_module(
        DEFAULT_MODULE_ID, cfg, batch)
    assert torch.allclose(loss, sum(_torchrl_iql(m, td, cfg)), rtol=1e-12)


@pytest.mark.parametrize("plant", ["", "weight", "discount"])
def test_discrete_cql_loss_equals_torchrl(plant: str) -> None:
    """Discrete CQL: DQN's TD loss (squared, halved) and the log-sum-exp over every action,
    against TorchRL's ``DiscreteCQLLoss`` (its penalty unweighted: the user weights it).
    TorchRL's target network is its copy of the online one, as the module's is when built."""
    from torchrl.data import Categorical
    from torchrl.modules import QValueActor
    from torchrl.objectives import DiscreteCQLLoss

    from rlloop.algorithms.cql import DiscreteCQLLearner, DiscreteCQLModule
    from rlloop.data.transitions import Transitions
    from rlloop.learners.learner import DEFAULT_MODULE_ID

    torch.manual_seed(4)
    m = DiscreteCQLModule(OBS, 3, CQLConfig(dataset="-", hidden=[16, 16])).double()
    td = _batch(2)
    td["action"] = torch.tensor([0, 2, 1, 1, 0, 2])
    nxt = td["next"]
    gamma = GAMMA / 2 if plant == "discount" else GAMMA
    batch = Transitions(td["observation"], td["action"], nxt["reward"][:, 0],
                        nxt["observation"], nxt["terminated"][:, 0],
                        torch.full((B,), gamma, dtype=torch.float64))
    cfg = CQLConfig(dataset="-", hidden=[16, 16], cql_weight=3.0 if plant == "weight" else 2.0)
    learner = DiscreteCQLLearner({DEFAULT_MODULE_ID: m}, cfg)
    _, ours = learner.compute_loss_for_module(DEFAULT_MODULE_ID, cfg, batch)

    actor = QValueActor(TensorDictModule(m.critic, in_keys=["observation"],
                                         out_keys=["action_value"]),
                        spec=Categorical(3), action_space="categorical")
    loss = DiscreteCQLLoss(actor, loss_function="l2", delay_value=True,
                           action_space="categorical")
    loss.make_value_estimator(gamma=GAMMA)
    out = loss(td.clone())
    same = (torch.allclose(ours["losses/critic"], out["loss_qvalue"], rtol=1e-10)
            and torch.allclose(ours["losses/cql"], 2.0 * out["loss_cql"], rtol=1e-10))
    assert same == (not plant), (plant, ours, out)
