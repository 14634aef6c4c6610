"""DQN inside the algorithm: target-network cadence, double/dueling options, epsilon
schedule, the batched-target fast path, prioritized replay and config errors."""

from __future__ import annotations

import copy
import dataclasses
from typing import cast

import pytest
import torch
from torch.testing import assert_close

from rlloop.algorithms.offpolicy_base import OffPolicyAlgorithmBase
from rlloop.algorithms.offpolicy_parts import OneStepProcessor
from rlloop.config.loading import build_config
from rlloop.data.nstep import NStepProcessor
from rlloop.data.prioritized_replay import PrioritizedReplayBuffer
from rlloop.data.transitions import Transitions
from rlloop.errors import ConfigError
from rlloop.losses.dqn import dqn_loss, dqn_target
from rlloop.modules.q_networks import QNetwork
from rlloop.runs.build import build_algorithm

QUIET = ["mlflow=false", "progress=false", "num_envs=1"]
TINY = ["dqn.hidden=[16,16]", "dqn.batch_size=8", "dqn.buffer_size=500",
        "dqn.learning_starts=20", "dqn.gradient_steps=1", "dqn.opt_interval=1"]


def _dqn(*sets: str):
    config = build_config("dqn", "CartPole-v1", sets=[*QUIET, *TINY, *sets])
    algo = cast(OffPolicyAlgorithmBase, build_algorithm(config))
    for _ in range(40):
        algo.env_step()
    return algo


def _params(module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_hard_target_update_every_k_updates():
    algo = _dqn("dqn.target_update_interval=3", "dqn.tau=1.0")
    m = algo.learner.module()
    start = _params(m.target)
    assert _same(start, _params(m.online))  # the target starts as a copy
    history = []
    for _ in range(7):
        algo.optimize(40)  # one update per optimisation step here
        history.append((algo.learner.updates, _same(_params(m.target), _params(m.online)),
                        _same(_params(m.target), start)))
    # Synced right after updates 3 and 6; frozen in between.
    assert [u for u, synced, _ in history if synced] == [3, 6]
    assert [u for u, _, unchanged in history if unchanged] == [1, 2]
    for p in m.target.parameters():
        assert not p.requires_grad


def test_polyak_target_update():
    algo = _dqn("dqn.target_update_interval=2", "dqn.tau=0.25")
    m = algo.learner.module()
    algo.optimize(40)
    before = _params(m.target)
    algo.optimize(40)  # update 2: target <- 0.75 target + 0.25 online
    expected = [t + 0.25 * (o - t) for t, o in zip(before, _params(m.online), strict=True)]
    assert all(torch.allclose(x, y) for x, y in zip(_params(m.target), expected, strict=True))


@pytest.mark.parametrize("double_q", [False, True])
def test_loss_is_the_pure_dqn_loss(double_q):
    algo = _dqn(f"dqn.double_q={str(double_q).lower()}")
    learner, m = algo.learner, algo.learner.module()
    batch = algo.loop.replay.sample(8, torch.Generator().manual_seed(0)).for_update()
    with torch.no_grad():
        online_next = m.online(batch.next_obs) if double_q else None
        target = dqn_target(batch.reward, batch.discount, batch.terminated,
                            m.target(batch.next_obs), online_next)
    expected, _, _ = dqn_loss(m.online(batch.obs), batch.action, target)
    loss, stats = learner.compute_loss_for_module("default_policy", learner.config, batch)
    assert_close(loss, expected)
    assert set(stats) == {"losses/q", "q/mean", "q/td_abs_mean"}


def test_batched_targets_match_per_update_targets():
    # With a fixed target network, computing all TD targets of an optimisation step in
    # one pass gives the same updates as computing them batch by batch.
    algo = _dqn("dqn.target_update_interval=1000")
    learner = algo.learner
    twin = copy.deepcopy(learner)
    big = algo.loop.replay.sample(5 * 8, torch.Generator().manual_seed(1))
    assert learner.updates_with_fixed_target(5) == 5
    targets = learner.targets(big).split(8)
    for i, (obs, action) in enumerate(zip(big.obs.split(8), big.action.split(8),
                                          strict=True)):
        learner.update_towards(obs, action, targets[i])
    for i in range(5):
        rows = slice(8 * i, 8 * (i + 1))
        twin.update(Transitions(big.obs[rows], big.action[rows], big.reward[rows],
                                big.next_obs[rows], big.terminated[rows], big.discount[rows]))
    for a, b in zip(learner.module().parameters(), twin.module().parameters(), strict=True):
        assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert learner.updates == twin.updates == 5


def test_fixed_target_window_follows_the_sync_cadence():
    algo = _dqn("dqn.target_update_interval=4")
    learner = algo.learner
    assert learner.updates_with_fixed_target(10) == 4
    learner.updates = 6
    assert learner.updates_with_fixed_target(10) == 2
    assert learner.updates_with_fixed_target(1) == 1
    double = _dqn("dqn.double_q=true").learner
    assert double.updates_with_fixed_target(10) == 0  # double DQN: no shared targets


def test_dueling_head():
    torch.manual_seed(0)
    q = QNetwork(4, 3, [8, 8], dueling=True)
    obs = torch.randn(5, 4)
    x = q.net(obs).relu()
    value, adv = q.value(x), q.advantage(x)
    assert_close(q(obs), value + adv - adv.mean(1, keepdim=True))
    # The dueling head's advantages are centred: mean_a Q(s, a) == V(s).
    assert_close(q(obs).mean(1, keepdim=True), value)


def test_epsilon_decays_on_the_env_step_timeline_and_resumes():
    algo = _dqn("dqn.exploration_steps=100", "dqn.exploration_final_eps=0.1")
    assert algo.epsilon(0) == 1.0 and algo.epsilon(50) == pytest.approx(0.55)
    assert algo.epsilon(100) == algo.epsilon(10**6) == pytest.approx(0.1)
    state = algo.get_state()
    assert state["offpolicy"]["env_steps"] == 40  # the schedule's position is saved
    other = _dqn("seed=3")
    other.set_state(state)
    assert other.loop.env_steps == 40


def test_exploration_acts_with_the_scheduled_epsilon():
    # At env step 40 of 100 epsilon is 0.6 (final 0): about 30% of actions leave the greedy
    # one (a random action of two matches it half the time); with the final epsilon, none.
    algo = _dqn("dqn.exploration_steps=100", "dqn.exploration_final_eps=0.0")
    assert algo.loop.env_steps == 40 and algo.epsilon(40) == pytest.approx(0.6)
    obs = torch.randn(4000, 4)
    off_greedy = (algo._explore(obs) != algo.q(obs).argmax(1)).double().mean()
    assert abs(float(off_greedy) - 0.3) < 0.04


def test_greedy_acting_and_stochastic_eval_rng():
    algo = _dqn()
    obs = torch.randn(6, 4)
    assert torch.equal(algo.act(obs), algo.q(obs).argmax(1))
    before = algo.generator.get_state()
    algo.act(obs, deterministic=False)
    assert torch.equal(algo.generator.get_state(), before)  # eval never draws from it


def test_prioritized_replay_updates_priorities():
    algo = _dqn("dqn.replay=prioritized")
    replay = algo.loop.replay
    assert isinstance(replay, PrioritizedReplayBuffer)
    algo.optimize(40)
    priorities = replay.get_state()["priorities"]
    assert len(set(priorities.tolist())) > 1  # TD errors replaced the initial priority


def test_prioritized_replay_weights_reach_the_loss():
    algo = _dqn("dqn.replay=prioritized", "dqn.double_q=true")
    algo.optimize(40)  # TD errors make the priorities, hence the weights, uneven
    learner, m = algo.learner, algo.learner.module()
    drawn = algo.loop.replay.sample(16, torch.Generator().manual_seed(0), beta=0.4)
    batch = drawn.for_update()
    assert batch.weights is not None and len(set(batch.weights.tolist())) > 1
    with torch.no_grad():
        target = dqn_target(batch.reward, batch.discount, batch.terminated,
                            m.target(batch.next_obs), m.online(batch.next_obs))
    weighted, _, _ = dqn_loss(m.online(batch.obs), batch.action, target, batch.weights)
    plain, _, _ = dqn_loss(m.online(batch.obs), batch.action, target)
    loss, _ = learner.compute_loss_for_module("default_policy", learner.config, batch)
    assert_close(loss, weighted)
    assert not torch.allclose(loss, plain)


def test_n_step_transitions():
    algo = _dqn("dqn.n_step=3")
    assert isinstance(algo.loop.processor, NStepProcessor)
    discounts = algo.loop.replay.get_state()["discount"]
    assert torch.isclose(discounts, torch.tensor(0.99**3)).any()
    assert algo.optimize(40) is not None


def test_one_step_processor_matches_n_step_processor():
    n, gamma = 3, 0.9
    fast = OneStepProcessor(n, gamma)
    slow = NStepProcessor(n, 1, gamma, (2,), (), torch.int64)
    args = (torch.randn(n, 2), torch.tensor([0, 1, 0]), torch.randn(n), torch.randn(n, 2),
            torch.tensor([False, True, False]), torch.tensor([False, False, True]))
    fast_fields, slow_fields = (dataclasses.astuple(p.process(*args)) for p in (fast, slow))
    for a, b in zip(fast_fields, slow_fields, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)


@pytest.mark.parametrize(
    ("env", "sets", "message"),
    [
        ("Pendulum-v1", [], "dqn needs discrete actions"),
        ("CartPole-v1", ["dqn.tau=0"], "dqn.tau must be in"),
        ("CartPole-v1", ["dqn.exploration_final_eps=2"], "exploration_final_eps must be in"),
        ("CartPole-v1", ["dqn.replay=fancy"], "dqn.replay must be one of"),
        ("CartPole-v1", ["dqn.opt_interval=0"], "dqn.opt_interval must be > 0"),
        ("CartPole-v1", ["dqn.hidden=[]"], "dqn.hidden must be a non-empty list"),
        ("CartPole-v1", ["horizons_per_env_reset=2"], "horizons_per_env_reset must be < 0"),
        ("CartPole-v1", ["dqn.buffer_size=100000000000"],
         r"dqn.buffer_size=100,000,000,000: needs .* GiB .* lower it, "
         r"e.g. --set dqn.buffer_size=[1-9]0* \(at most [\d,]+ fit\)$"),
    ],
)
def test_bad_config_is_a_config_error(env, sets, message):
    with pytest.raises(ConfigError, match=message):
        build_algorithm(build_config("dqn", env, sets=[*QUIET, *sets]))


@pytest.mark.parametrize("mode", ["skip", "raise"])
def test_non_finite_loss_skips_or_raises(mode):
    from rlloop.learners.nonfinite import NonFiniteError

    algo = _dqn(f"on_nonfinite={mode}")
    batch = algo.loop.replay.sample(8, torch.Generator().manual_seed(0)).for_update()
    bad = Transitions(batch.obs, batch.action, batch.reward * float("nan"), batch.next_obs,
                      batch.terminated, batch.discount)
    before = _params(algo.learner.module())
    if mode == "raise":
        with pytest.raises(NonFiniteError):
            algo.learner.update(bad)
    else:
        algo.learner.update(bad)
        # Skipped on the device, so the update still counts towards the target cadence
        # (the host learns of the skip only when the counter is read).
        assert algo.learner.skipped_updates == 1 and algo.learner.updates == 1
    assert _same(before, _params(algo.learner.module()))
