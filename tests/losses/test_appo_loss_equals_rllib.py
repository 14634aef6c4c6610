"""APPO's and IMPALA's losses (V-trace, then :func:`appo_loss` or :func:`a2c_loss`) equal
RLlib 2.60's own ``compute_loss_for_module`` of ``APPOTorchLearner`` and
``IMPALATorchLearner`` on identical inputs in float64: the loss, its terms and its gradients
with respect to the logits and values. RLlib's learner method runs as it is, on a stand-in
RL module that hands it the crafted logits and values; a planted error shows.

Where RLlib computes something else, the test says what, in rlloop's terms:

- its APPO ratio is taken against its target network, ``clip(mu / pi_target, 0, 2) *
  pi_theta / mu`` (IMPACT), where rlloop's is ``pi_theta / mu``, with V-trace's ``pi`` the
  same network: the two agree when the target network is the behaviour policy;
- each of its rows ends in one appended step (``AddOneTsToEpisodesAndTruncate``: reward 0,
  its loss masked, its discount 0) whose TD error ``rho_T (0 - V(x_T))`` still flows into
  the last real step's V-trace target, so a fragment cut by its end bootstraps from
  ``V(x_T)`` only in part. Rows that end in a termination, or whose bootstrap value is 0,
  are unaffected; the others equal rlloop's V-trace run over the appended step as a
  terminal one.
"""

from __future__ import annotations

import types
from typing import Any, NamedTuple

import pytest
import torch
from torch import Tensor

from rlloop.losses import appo as appo_module
from rlloop.losses.a2c import a2c_loss
from rlloop.losses.ppo import PPOLossConfig
from rlloop.losses.vtrace import vtrace

rllib_appo = pytest.importorskip("ray.rllib.algorithms.appo.torch.appo_torch_learner")
from ray.rllib.algorithms.impala.torch.impala_torch_learner import (  # noqa: E402
    IMPALATorchLearner,
)
from ray.rllib.core.columns import Columns  # noqa: E402
from ray.rllib.core.distribution.torch.torch_distribution import (  # noqa: E402
    TorchCategorical,
)
from ray.rllib.core.rl_module.apis import (  # noqa: E402
    TARGET_NETWORK_ACTION_DIST_INPUTS,
    TargetNetworkAPI,
    ValueFunctionAPI,
)

F64 = torch.float64
B, T, N_ACTIONS = 4, 6, 3  # rows (envs), real steps per row, actions
GAMMA = 0.9375  # exact in float32: RLlib makes its discounts in float32
CLIP, VF_COEF, ENT_COEF = 0.2, 0.5, 0.01


class Fragment(NamedTuple):
    """Rows of ``T`` real steps and RLlib's appended one, ``[B, T+1]`` (logits ``[B, T+1,
    A]``); the appended step repeats the last action and behaviour log-prob, its reward is
    0 and its value ``V(x_T)`` is the bootstrap value."""

    logits: Tensor  # the policy being learned (pi_theta), requires grad
    target_logits: Tensor  # V-trace's pi: RLlib's target network (rlloop: the batch's start)
    behaviour_log_probs: Tensor  # mu
    actions: Tensor
    rewards: Tensor
    values: Tensor  # requires grad
    terminated: Tensor


def _fragment(seed: int, lag: float, bootstrap_zero: bool = True) -> Fragment:
    """Row 0 terminates at its last real step, the others are cut by the fragment's end
    (with ``V(x_T) = 0`` unless ``bootstrap_zero`` is False). ``lag`` scales how far the
    target network is from the behaviour policy."""
    g = torch.Generator().manual_seed(seed)
    behaviour = torch.randn((B, T + 1, N_ACTIONS), generator=g, dtype=F64)
    target = behaviour + lag * torch.randn((B, T + 1, N_ACTIONS), generator=g, dtype=F64)
    logits = target + 0.4 * torch.randn((B, T + 1, N_ACTIONS), generator=g, dtype=F64)
    actions = torch.randint(0, N_ACTIONS, (B, T + 1), generator=g)
    actions[:, T] = actions[:, T - 1]
    mu = torch.distributions.Categorical(logits=behaviour).log_prob(actions)
    mu[:, T] = mu[:, T - 1]
    rewards = torch.randn((B, T + 1), generator=g, dtype=F64)
    rewards[:, T] = 0.0
    values = torch.randn((B, T + 1), generator=g, dtype=F64)
    if bootstrap_zero:
        values[1:, T] = 0.0
    terminated = torch.zeros((B, T + 1), dtype=torch.bool)
    terminated[0, T - 1] = True
    return Fragment(logits.requires_grad_(), target, mu, actions, rewards,
                    values.requires_grad_(), terminated)


class _Module(TargetNetworkAPI, ValueFunctionAPI):
    """Stands in for an RL module: hands RLlib's loss the fragment's logits and values."""

    def __init__(self, values: Tensor, target_logits: Tensor) -> None:
        self.values, self.target_logits = values, target_logits

    def make_target_networks(self) -> None:
        pass

    def get_target_network_pairs(self) -> list[Any]:
        return []

    def forward_target(self, batch: dict[str, Any]) -> dict[str, Tensor]:
        return {TARGET_NETWORK_ACTION_DIST_INPUTS: self.target_logits}

    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> Tensor:
        return self.values

    def get_train_action_dist_cls(self) -> type:
        return TorchCategorical

    def unwrapped(self) -> _Module:
        return self


def _rllib(learner_cls: type, frag: Fragment) -> tuple[Tensor, dict[str, Tensor]]:
    """RLlib's ``compute_loss_for_module`` on ``frag`` (flat rows of ``T+1`` steps, as its
    learner connectors leave them), the KL term off; its loss and logged terms."""
    def flat(x: Tensor) -> Tensor:
        return x.reshape(B * (T + 1), *x.shape[2:])

    mask = torch.ones((B, T + 1), dtype=torch.bool)
    mask[:, T] = False
    batch = {Columns.LOSS_MASK: flat(mask), Columns.ACTIONS: flat(frag.actions),
             Columns.ACTION_LOGP: flat(frag.behaviour_log_probs),
             Columns.REWARDS: flat(frag.rewards), Columns.TERMINATEDS: flat(frag.terminated)}
    config = types.SimpleNamespace(
        get_rollout_fragment_length=lambda: T + 1, gamma=GAMMA, clip_param=CLIP,
        vtrace_clip_rho_threshold=1.0, vtrace_clip_pg_rho_threshold=1.0,
        use_kl_loss=False, vf_loss_coeff=VF_COEF)
    logged: dict[str, Tensor] = {}
    learner = types.SimpleNamespace(
        module={"p": _Module(flat(frag.values), flat(frag.target_logits))},
        metrics=types.SimpleNamespace(log_dict=lambda d, key, window: logged.update(d)),
        entropy_coeff_schedulers_per_module={
            "p": types.SimpleNamespace(get_current_value=lambda: ENT_COEF)},
        curr_kl_coeffs_per_module={"p": 0.0})
    loss = learner_cls.compute_loss_for_module(
        learner, module_id="p", config=config, batch=batch,
        fwd_out={Columns.ACTION_DIST_INPUTS: flat(frag.logits)})
    return loss, logged


def _time_major(x: Tensor) -> Tensor:
    return x[:, :T].transpose(0, 1)


def _log_probs(logits: Tensor, actions: Tensor) -> Tensor:
    return torch.distributions.Categorical(logits=logits).log_prob(actions)


def _rlloop_vtrace(frag: Fragment, pi: Tensor) -> Any:
    """rlloop's V-trace of the real steps, V-trace's pi's log-probs ``pi`` ``[B, T+1]``."""
    no = torch.zeros((T, B), dtype=torch.bool)
    values = frag.values.detach()
    return vtrace(_time_major(pi.detach()), _time_major(frag.behaviour_log_probs),
                  _time_major(frag.rewards), _time_major(values), values[:, 1:].T,
                  _time_major(frag.terminated), no, GAMMA)


def _rlloop_appo(frag: Fragment, ratio_against: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """vtrace, then appo_loss with its ratio against ``ratio_against``'s log-probs
    (rlloop: the behaviour policy's)."""
    out = _rlloop_vtrace(frag, _log_probs(frag.target_logits, frag.actions))
    dist = torch.distributions.Categorical(logits=_time_major(frag.logits))
    values = _time_major(frag.values)
    cfg = PPOLossConfig(CLIP, VF_COEF, ENT_COEF, None, normalize_advantages=False)
    return appo_module.appo_loss(
        dist.log_prob(_time_major(frag.actions)).flatten(),
        _time_major(ratio_against).flatten(), out.advantages.flatten(), values.flatten(),
        values.detach().flatten(), out.targets.flatten(), dist.entropy().flatten(), cfg)


def _gradients(loss: Tensor, frag: Fragment) -> tuple[Tensor, Tensor]:
    logits, values = torch.autograd.grad(loss, [frag.logits, frag.values])
    return logits, values


def _max_difference(ours: tuple[Tensor, dict[str, Tensor]],
                    theirs: tuple[Tensor, dict[str, Tensor]], frag: Fragment,
                    pairs: dict[str, str]) -> float:
    """The largest absolute difference of the losses, the named terms and the gradients."""
    diffs = [(ours[0] - theirs[0]).abs()]
    diffs += [(ours[1][mine] - theirs[1][rllib]).abs() for mine, rllib in pairs.items()]
    for a, b in zip(_gradients(ours[0], frag), _gradients(theirs[0], frag), strict=True):
        diffs.append((a - b).abs().max())
    return float(torch.stack([d.detach() for d in diffs]).max())


APPO_TERMS = {"losses/policy": "policy_loss", "losses/value": "vf_loss",
              "losses/entropy": "entropy"}


@pytest.mark.parametrize("seed", [0, 1])
def test_appo_loss_equals_rllibs_with_its_target_network_at_the_behaviour_policy(
        seed: int) -> None:
    """The target network at mu (RLlib's IS ratio is 1): the ratio pi_theta / mu, clipped
    where it leaves [0.8, 1.2] (a third of the steps here), V-trace's advantages and
    targets, the entropy: loss, terms and gradients equal to 1e-12."""
    frag = _fragment(seed, lag=0.0)
    frag = frag._replace(target_logits=frag.target_logits.detach())
    ratio = (_log_probs(frag.logits, frag.actions) - frag.behaviour_log_probs).exp()[:, :T]
    assert 0.2 < float(((ratio - 1).abs() > CLIP).double().mean()) < 0.8
    ours = _rlloop_appo(frag, frag.behaviour_log_probs)
    theirs = _rllib(rllib_appo.APPOTorchLearner, frag)
    assert _max_difference(ours, theirs, frag, APPO_TERMS) < 1e-12


@pytest.mark.parametrize("seed", [2, 3])
def test_with_a_lagging_target_network_rllibs_ratio_is_against_it(seed: int) -> None:
    """The target network away from mu (V-trace's rho and c clipped at 1 on some steps):
    RLlib's loss is appo_loss with its ratio against the target network instead of mu
    (where mu / pi_target stays inside RLlib's [0, 2]), and differs from rlloop's."""
    frag = _fragment(seed, lag=0.3)
    target = _log_probs(frag.target_logits, frag.actions)
    is_ratio = (frag.behaviour_log_probs - target).exp()[:, :T]  # the real steps'
    assert bool((is_ratio < 2).all()) and float((1 / is_ratio).max()) > 1.1
    theirs = _rllib(rllib_appo.APPOTorchLearner, frag)
    against_target = _rlloop_appo(frag, target.detach())
    assert _max_difference(against_target, theirs, frag, APPO_TERMS) < 1e-12
    rlloops = _rlloop_appo(frag, frag.behaviour_log_probs)
    assert float((rlloops[1]["losses/policy"] - theirs[1]["policy_loss"].detach()).abs()) > 1e-3


def test_rllibs_appended_step_cuts_the_bootstrap_at_a_fragments_end() -> None:
    """``V(x_T) != 0`` on the rows cut by the fragment's end: RLlib's value targets are
    rlloop's V-trace run over the appended step as a terminal step (reward 0), not
    rlloop's, which bootstraps from ``V(x_T)`` in full."""
    frag = _fragment(4, lag=0.0, bootstrap_zero=False)
    theirs = float(_rllib(rllib_appo.APPOTorchLearner, frag)[1]["vf_loss"].detach())
    mu, values = frag.behaviour_log_probs, frag.values.detach()
    ends = frag.terminated.clone()
    ends[:, T] = True
    padded = vtrace(_log_probs(frag.target_logits, frag.actions).T, mu.T, frag.rewards.T,
                    values.T, torch.cat([values[:, 1:], values[:, :1]], 1).T, ends.T,
                    torch.zeros_like(ends).T, GAMMA)
    as_rllib = 0.5 * (_time_major(values) - padded.targets[:T]).pow(2).mean()
    ours = _rlloop_appo(frag, mu)[1]["losses/value"]
    assert abs(float(as_rllib) - theirs) < 1e-12
    assert abs(float(ours) - theirs) > 1e-2


def _rlloop_impala(frag: Fragment) -> tuple[Tensor, dict[str, Tensor]]:
    """vtrace under the policy being learned (one step per batch), then a2c_loss."""
    out = _rlloop_vtrace(frag, _log_probs(frag.logits, frag.actions))
    dist = torch.distributions.Categorical(logits=_time_major(frag.logits))
    return a2c_loss(dist.log_prob(_time_major(frag.actions)).flatten(),
                    out.advantages.flatten(), _time_major(frag.values).flatten(),
                    out.targets.flatten(), dist.entropy().flatten(), VF_COEF, ENT_COEF)


IMPALA_TERMS = {"losses/policy": "mean_pi_loss", "losses/value": "mean_vf_loss",
                "losses/entropy": "entropy"}


@pytest.mark.parametrize("seed", [5, 6])
def test_impala_loss_equals_rllibs(seed: int) -> None:
    """V-trace with pi the policy being learned (rho and c clipped where pi > mu), then
    the policy gradient, value and entropy terms: equal to 1e-12."""
    frag = _fragment(seed, lag=0.3)
    rho = (_log_probs(frag.logits, frag.actions) - frag.behaviour_log_probs).exp()
    assert bool((rho > 1).any()) and bool((rho < 1).any())
    diff = _max_difference(_rlloop_impala(frag), _rllib(IMPALATorchLearner, frag), frag,
                           IMPALA_TERMS)
    assert diff < 1e-12


def test_a_planted_error_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """APPO's ratio taken against the policy being learned instead of the behaviour
    policy (it is then always 1 and the clip never bites): RLlib disagrees."""
    real = appo_module.ppo_loss

    def wrong(log_prob: Tensor, old_log_prob: Tensor, *rest: Any) -> Any:
        return real(log_prob, log_prob.detach(), *rest)

    monkeypatch.setattr(appo_module, "ppo_loss", wrong)
    frag = _fragment(0, lag=0.0)
    diff = _max_difference(_rlloop_appo(frag, frag.behaviour_log_probs),
                           _rllib(rllib_appo.APPOTorchLearner, frag), frag, APPO_TERMS)
    assert diff > 1e-3
