"""Invalid-action masking from ``info["action_mask"]`` for PPO and DQN: the math of the
masked policy, masked actions never taken (training, evaluation), and refusals."""

from __future__ import annotations

import subprocess

import pytest
import torch
from conftest import rlloop_cmd
from mask_envs import N_ACTIONS, MaskedChoice
from stepping import run_iterations

from rlloop.config.loading import build_config
from rlloop.envs.action_masks import (
    ILLEGAL_LOGIT,
    legal_actions,
    mask_scores,
)
from rlloop.envs.core import Discrete
from rlloop.envs.registry import make_env
from rlloop.errors import ConfigError
from rlloop.modules.distributions import Categorical
from rlloop.modules.masked import MaskedActorCritic, random_legal_actions
from rlloop.modules.q_networks import QNetwork
from rlloop.runs.build import build_algorithm

ENV = "rlloop-test/MaskedChoice-v0"
QUIET = ["mlflow=false", "progress=false", "save_video=false"]


def _legal(rows: int, n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    legal = torch.rand(rows, n, generator=g) < 0.5
    legal[torch.arange(rows), torch.randint(n, (rows,), generator=g)] = True
    return legal


def test_masked_categorical_is_the_categorical_over_legal_actions():
    logits, legal = torch.randn(64, 6) * 3, _legal(64, 6)
    d = Categorical(mask_scores(logits, legal))
    direct = torch.where(legal, logits, -torch.inf)
    p = torch.softmax(direct, -1)
    log_p = torch.where(legal, torch.log_softmax(direct, -1), 0.0)
    actions = torch.multinomial(p, 1, generator=torch.Generator().manual_seed(1)).squeeze(1)
    torch.testing.assert_close(d.log_prob(actions), log_p.gather(1, actions[:, None])[:, 0])
    torch.testing.assert_close(d.entropy(), -(p * log_p).sum(-1))
    assert torch.isfinite(d.entropy()).all()
    g = torch.Generator().manual_seed(2)
    for _ in range(50):
        assert legal.gather(1, d.sample(g)[:, None]).all()
        assert legal.gather(1, random_legal_actions(legal, g)[:, None]).all()


def test_an_all_zero_mask_leaves_every_action_open():
    obs = torch.zeros(2, 7)
    obs[0, -3:] = torch.tensor([0.0, 1.0, 0.0])
    legal = legal_actions(obs, 3)
    assert legal.tolist() == [[False, True, False], [True, True, True]]


def test_the_loss_path_sees_the_same_masked_policy_as_acting():
    # dist_value is what the PPO loss reads: it must mask exactly as act() did, or the
    # probability ratio compares a masked policy with an unmasked one.
    net = MaskedActorCritic((3 + 4,), Discrete(4), 4)
    obs = torch.cat([torch.randn(32, 3), _legal(32, 4).float()], 1)
    actions, log_probs = net.act(obs, generator=torch.Generator().manual_seed(0))
    dist, _ = net.dist_value(obs)
    torch.testing.assert_close(dist.log_prob(actions), log_probs)
    first = torch.zeros_like(actions)
    assert (dist.log_prob(first)[obs[:, 3] == 0] < -1e6).all()  # action 0 where illegal


def test_masked_q_values_give_a_masked_max_and_argmax():
    q = QNetwork(3 + 4, 4, [16], mask_dims=4)
    obs = torch.cat([torch.randn(64, 3), _legal(64, 4).float()], 1)
    legal = obs[:, -4:] > 0
    raw = q._q(obs)
    masked = q(obs)
    assert (masked[~legal] == ILLEGAL_LOGIT).all()
    torch.testing.assert_close(masked.max(1).values,
                               torch.where(legal, raw, -torch.inf).max(1).values)
    assert legal.gather(1, masked.argmax(1)[:, None]).all()


def test_the_env_appends_each_step_mask_and_keeps_the_final_one():
    env = make_env(ENV, 4, seed=0)
    try:
        assert env.spec.action_mask == N_ACTIONS and env.spec.obs_shape == (2 * N_ACTIONS,)
        obs, g, ends = env.reset(), torch.Generator().manual_seed(0), 0
        for _ in range(40):
            # The rewarded action (one-hot in the first half) is legal in every state:
            # a mask from the wrong state (e.g. the next episode's) breaks that.
            assert obs[:, N_ACTIONS:].gather(1, obs[:, :N_ACTIONS].argmax(1)[:, None]).all()
            action = random_legal_actions(obs[:, N_ACTIONS:] > 0, g)
            res = env.step(action)
            final = res.final_obs
            assert final[:, N_ACTIONS:].gather(1, final[:, :N_ACTIONS].argmax(1)[:, None]).all()
            ends += int(res.truncated.sum())
            obs = res.obs
        assert ends == 4 * 5
    finally:
        env.close()


def _train(algo: str, sets: list[str], iterations: int) -> tuple[object, int]:
    MaskedChoice.illegal = MaskedChoice.steps = 0
    a = build_algorithm(build_config(algo, ENV, flags={"seed": 0, "num_envs": 4},
                                     sets=[*QUIET, *sets]))
    return a, run_iterations(a, iterations)


def _evaluate_both_ways(a) -> None:  # type: ignore[no-untyped-def]
    a.evaluate(10)
    a.evaluate(10, deterministic=False)


def test_ppo_never_takes_a_masked_action():
    a, _ = _train("ppo", ["ppo.rollout_steps=32", "ppo.num_epochs=2"], 8)
    try:
        buf = a.buffer  # type: ignore[attr-defined]
        assert (buf.obs[..., N_ACTIONS:] > 0).gather(-1, buf.actions[..., None]).all()
        _evaluate_both_ways(a)
        assert MaskedChoice.steps > 1000 and MaskedChoice.illegal == 0
    finally:
        a.close()  # type: ignore[attr-defined]


@pytest.mark.parametrize("algo, sets", [
    ("ppo", ["ppo.rollout_steps=32", "ppo.num_epochs=1"]),
    ("dqn", ["dqn.learning_starts=100", "dqn.batch_size=16"]),
])
def test_info_masks_of_a_dict_observation_env_are_honoured(algo, sets):
    """A Dict observation with its mask in ``info`` (not an entry) was trained unmasked."""
    MaskedChoice.illegal = MaskedChoice.steps = 0
    a = build_algorithm(build_config(algo, "rlloop-test/MaskedChoiceDict-v0",
                                     flags={"seed": 0, "num_envs": 4}, sets=[*QUIET, *sets]))
    try:
        assert a.env.spec.action_mask == N_ACTIONS  # type: ignore[attr-defined]
        run_iterations(a, 4 if algo == "ppo" else 80)
        _evaluate_both_ways(a)
        assert MaskedChoice.steps > 300 and MaskedChoice.illegal == 0
    finally:
        a.close()  # type: ignore[attr-defined]


def test_the_async_backend_passes_info_masks_on():
    """``backend=gymnasium-async`` dropped every info: an env with info masks failed with
    "stopped returning info['action_mask']". Its workers are other processes, so the
    rollout's stored masks are checked: each step's action is legal under its mask, and
    the masks are the env's (some actions masked), not a default."""
    a = build_algorithm(build_config("ppo", "mask_envs:" + ENV, flags={
        "seed": 0, "num_envs": 2, "backend": "gymnasium-async"},
        sets=[*QUIET, "ppo.rollout_steps=32", "ppo.minibatch_size=32", "ppo.num_epochs=1"]))
    try:
        run_iterations(a, 3)  # episodes of 8 steps: final observations' masks too
        buf = a.buffer  # type: ignore[attr-defined]
        legal = buf.obs[..., N_ACTIONS:] > 0
        assert legal.gather(-1, buf.actions[..., None]).all() and (~legal).any()
    finally:
        a.close()  # type: ignore[attr-defined]


def test_without_masking_the_same_run_takes_masked_actions():
    a, _ = _train("ppo", ["ppo.rollout_steps=32", "ppo.num_epochs=2", "ppo.action_mask=false"],
                  2)
    a.close()  # type: ignore[attr-defined]
    assert MaskedChoice.illegal > 50  # so the count above can fail


def test_dqn_never_takes_a_masked_action_and_its_target_maxes_over_legal_actions():
    a, _ = _train("dqn", ["dqn.learning_starts=200", "dqn.exploration_steps=400",
                          "dqn.batch_size=16", "dqn.target_update_interval=10"], 150)
    try:
        _evaluate_both_ways(a)
        assert MaskedChoice.steps > 600 and MaskedChoice.illegal == 0
        batch = a.loop.replay.sample(64, torch.Generator().manual_seed(0))  # type: ignore[attr-defined]
        legal = batch.next_obs[:, N_ACTIONS:] > 0
        assert (~legal).any()  # the replay keeps the next states' masks
        target_net = a.learner.module().target  # type: ignore[attr-defined]
        with torch.no_grad():
            best = torch.where(legal, target_net._q(batch.next_obs), -torch.inf).max(1).values
            expected = batch.reward + batch.discount * best * ~batch.terminated
            torch.testing.assert_close(a.learner.targets(batch), expected)  # type: ignore[attr-defined]
    finally:
        a.close()  # type: ignore[attr-defined]


def test_qrdqn_never_takes_a_masked_action_on_prioritized_n_step_replay():
    # QR-DQN reuses DQN's masked acting and replays: its target picks the next action
    # by the legal actions' mean quantiles; prioritized n-step replay on the way.
    a, _ = _train("qrdqn", ["qrdqn.learning_starts=200", "qrdqn.exploration_steps=400",
                            "qrdqn.batch_size=16", "qrdqn.target_update_interval=10",
                            "qrdqn.n_quantiles=8", "qrdqn.replay=prioritized",
                            "qrdqn.n_step=3"], 100)
    try:
        _evaluate_both_ways(a)
        assert MaskedChoice.steps > 400 and MaskedChoice.illegal == 0
        batch = a.loop.replay.sample(64, torch.Generator().manual_seed(0))  # type: ignore[attr-defined]
        assert (batch.discount < 0.99**2).any()  # n-step rows
        legal = batch.next_obs[:, N_ACTIONS:] > 0
        assert (~legal).any()
        target_net = a.learner.module().target  # type: ignore[attr-defined]
        with torch.no_grad():
            z = target_net.quantiles(batch.next_obs)
            best = torch.where(legal, z.mean(1), -torch.inf).argmax(1)
            next_z = z[torch.arange(64), :, best]
            bootstrap = (batch.discount * ~batch.terminated)[:, None]
            expected = batch.reward[:, None] + bootstrap * next_z
            torch.testing.assert_close(a.learner.targets(batch), expected)  # type: ignore[attr-defined]
    finally:
        a.close()  # type: ignore[attr-defined]


@pytest.mark.parametrize("algo, env, sets, message", [
    ("ppo", "CartPole-v1", ["ppo.action_mask=true"],
     r"^ppo.action_mask=true but CartPole-v1 gives no info\['action_mask'\]"),
    ("dqn", "CartPole-v1", ["dqn.action_mask=true"], r"^dqn.action_mask=true but CartPole"),
    ("ppo", "Pendulum-v1", ["ppo.action_mask=true"],
     r"^ppo.action_mask needs Discrete actions but Pendulum-v1 has Box ones"),
    ("ppo", ENV, ["ppo.normalize_obs=true"], r"^ppo.normalize_obs cannot run with an action"),
    ("dqn", ENV, ["dqn.normalize_obs=true"], r"^dqn.normalize_obs cannot run with an action"),
    ("ppo", ENV, ["ppo.recurrent=lstm"], r"^recurrent PPO does not mask actions yet"),
])
def test_masking_that_cannot_work_is_refused(algo, env, sets, message):
    with pytest.raises(ConfigError, match=message):
        build_algorithm(build_config(algo, env, sets=[*QUIET, *sets]))


def test_the_cli_refuses_masking_without_masks_in_one_line(tmp_path, cli_env):
    out = subprocess.run(rlloop_cmd("train", "ppo", "--env", "CartPole-v1", "--set",
                                    "ppo.action_mask=true"), env=cli_env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0].startswith("rlloop: error: ppo.action_mask=true but CartPole-v1")
