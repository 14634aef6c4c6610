"""Recurrent PPO: sequences and padding, state resets at episode starts, gradients through
time, state carried in acting and in checkpoints, masked-velocity CartPole, bad input."""

from __future__ import annotations

import itertools
import subprocess

import gymnasium
import numpy as np
import pytest
import torch
from conftest import rlloop_cmd

from rlloop.algorithms.recurrent_ppo import RecurrentPPO
from rlloop.config.loading import build_config
from rlloop.data.sequences import chunk_states, sequence_mask, to_sequences
from rlloop.envs.core import Discrete
from rlloop.envs.masked_velocity import ENV_ID, MaskVelocity
from rlloop.envs.native.cartpole import CartPoleVecEnv
from rlloop.envs.registry import env_spec, make_env
from rlloop.errors import ConfigError
from rlloop.losses.ppo import PPOLossConfig, ppo_loss
from rlloop.modules.recurrent import RecurrentActorCritic
from rlloop.runs.build import build_algorithm
from rlloop.trainers.loop import Trainer

QUIET = ["mlflow=false", "progress=false", "save_video=false"]


def _algo(*sets: str, kind: str = "gru") -> RecurrentPPO:
    config = build_config("ppo", "CartPole-v1", sets=[
        *QUIET, "num_envs=4", "env.mask_velocity=true", f"ppo.recurrent={kind}",
        "ppo.recurrent_hidden=16", "ppo.hidden=[16]", "ppo.rollout_steps=40",
        "ppo.seq_len=16", "ppo.minibatch_size=64", *sets])
    algo = build_algorithm(config)
    assert isinstance(algo, RecurrentPPO)
    return algo


# ---- sequences ---------------------------------------------------------------------------
def test_rollouts_become_padded_chunks_of_each_env_in_order():
    t, n, length = 5, 2, 2  # K = 3 chunks per env, the last one half padding
    x = torch.arange(t * n).view(t, n)  # x[t, n] = 2 t + n
    seqs = to_sequences(x, length)
    assert seqs.tolist() == [[0, 2], [4, 6], [8, 0], [1, 3], [5, 7], [9, 0]]
    mask = sequence_mask(t, n, length, torch.device("cpu"))
    assert mask.tolist() == [[True, True], [True, True], [True, False]] * 2
    states = torch.arange(t * n * 3).view(t, n, 3)
    assert torch.equal(chunk_states(states, length),  # the state entering each chunk
                       torch.stack([states[0, 0], states[2, 0], states[4, 0],
                                    states[0, 1], states[2, 1], states[4, 1]]))
    # Trailing feature dims travel along; an exact multiple needs no padding.
    assert to_sequences(torch.zeros(4, 3, 7, 2), 2).shape == (6, 2, 7, 2)
    assert bool(sequence_mask(4, 3, 2, torch.device("cpu")).all())


def test_padding_is_left_out_of_the_loss():
    g = torch.Generator().manual_seed(0)
    real = [torch.randn(10, generator=g) for _ in range(7)]
    garbage = [torch.full((6,), 1e6) for _ in range(7)]
    mask = torch.cat([torch.ones(10, dtype=torch.bool), torch.zeros(6, dtype=torch.bool)])
    cfg = PPOLossConfig(clip_vf=0.3)
    loss, stats = ppo_loss(*real, cfg)
    padded, padded_stats = ppo_loss(*[torch.cat([r, p]) for r, p in zip(real, garbage,
                                                                         strict=True)],
                                    cfg, mask=mask)
    torch.testing.assert_close(padded, loss)
    for key, value in stats.items():
        torch.testing.assert_close(padded_stats[key], value)


# ---- the recurrent core --------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_an_episode_start_resets_the_state_inside_a_sequence(kind):
    torch.manual_seed(0)
    net = RecurrentActorCritic((3,), Discrete(2), kind, hidden_size=8, head_hidden=(8,))
    obs = torch.randn(2, 6, 3)
    state = torch.randn(2, net.state_size)
    starts = torch.zeros(2, 6, dtype=torch.bool)
    starts[:, 3] = True
    feats, _ = net.unroll(obs, state, starts)
    fresh, _ = net.unroll(obs[:, 3:], net.initial_state(2, torch.device("cpu")),
                          starts[:, 3:])
    torch.testing.assert_close(feats[:, 3:], fresh)  # nothing of steps 0-2 reaches step 3
    leaky, _ = net.unroll(obs, state, torch.zeros_like(starts))
    assert not torch.allclose(leaky[:, 3:], fresh)  # so the test can tell


def test_gradients_flow_through_time_until_an_episode_start():
    torch.manual_seed(0)
    net = RecurrentActorCritic((3,), Discrete(2), "lstm", hidden_size=8, head_hidden=(8,))
    obs = torch.randn(1, 5, 3, requires_grad=True)
    starts = torch.zeros(1, 5, dtype=torch.bool)
    feats, _ = net.unroll(obs, net.initial_state(1, torch.device("cpu")), starts)
    net.value(feats[:, -1]).sum().backward()
    assert bool((obs.grad[0].abs().sum(-1) > 0).all())  # every step back to the first
    obs.grad = None
    starts[0, 2] = True
    feats, _ = net.unroll(obs, net.initial_state(1, torch.device("cpu")), starts)
    net.value(feats[:, -1]).sum().backward()
    per_step = obs.grad[0].abs().sum(-1)
    assert bool((per_step[:2] == 0).all()) and bool((per_step[2:] > 0).all())


# ---- the algorithm -------------------------------------------------------------------------
def test_rollout_log_probs_are_those_of_each_episode_on_its_own():
    """Collection resets the state where an episode starts: every action's stored
    log-probability equals the one its episode gives run alone from a zero state, and the
    training forward (sequences from stored states) reproduces all of them."""
    algo = _algo("ppo.rollout_steps=100")
    try:
        algo.collect()
        algo.collect()  # the second rollout starts mid-episode, from carried state
        buf = algo.buffer
        starts = algo.rollout_starts
        assert bool(starts[1:].any()), "no episode started inside the rollout"
        net = algo.policy
        checked = 0
        with torch.no_grad():
            for env in range(buf.num_envs):
                rows = starts[:, env].nonzero().flatten().tolist()
                for begin, end in itertools.pairwise(rows):
                    obs = buf.obs[begin:end, env].unsqueeze(0)
                    feats, _ = net.unroll(obs, net.initial_state(1, algo.device),
                                          torch.zeros(1, end - begin, dtype=torch.bool))
                    lp = net.dist(feats[0]).log_prob(buf.actions[begin:end, env])
                    torch.testing.assert_close(lp, buf.log_probs[begin:end, env])
                    checked += 1
            assert checked >= 4
            batch = algo._batch()
            dist, values = algo.learner.forward_train("default_policy", batch)
            lp = dist.log_prob(batch.actions.flatten(0, 1)).view_as(batch.log_probs)
            torch.testing.assert_close(lp[batch.mask], batch.log_probs[batch.mask])
            torch.testing.assert_close(values.view_as(batch.values)[batch.mask],
                                       batch.values[batch.mask])
        # Leaking state across episodes would change them: ignore the starts.
        with torch.no_grad():
            leaky, _ = net.unroll(buf.obs.transpose(0, 1), algo.rollout_states[0],
                                  torch.zeros_like(algo.rollout_starts.T))
            lp = net.dist(leaky.flatten(0, 1)).log_prob(buf.actions.T.flatten())
        assert not torch.allclose(lp, buf.log_probs.T.flatten())
    finally:
        algo.close()


def test_acting_carries_state_and_forgets_it_at_episode_starts():
    algo = _algo()
    try:
        obs = torch.tensor([[0.01, -0.02], [0.03, 0.01]])
        algo.begin_episodes(torch.ones(2, dtype=torch.bool))
        algo.act(obs)
        first = algo._act_state.clone()
        algo.act(obs)
        assert not torch.equal(algo._act_state, first)  # the state moved on
        algo.begin_episodes(torch.tensor([True, False]))
        carried = algo._act_state.clone()
        algo.act(obs)
        torch.testing.assert_close(algo._act_state[0], first[0])  # env 0 started afresh
        assert not torch.allclose(algo._act_state[1], first[1])
        assert not torch.equal(carried[1], algo._act_state[1])
        assert algo.evaluate(3)["episodes"] == 3.0
    finally:
        algo.close()


def test_training_state_is_checkpointed_and_reloaded(tmp_path):
    first, second = _algo(), _algo("seed=3")
    try:
        trainer = Trainer(first)
        trainer.step()
        trainer.step()
        state = first.get_state()
        assert bool(state["recurrent"]["state"].abs().sum() > 0)
        second.set_state(state)
        assert torch.equal(second.state, first.state)
        assert torch.equal(second.starts, first.starts)
        first.collect()
        second.collect()
        assert torch.equal(first.buffer.log_probs, second.buffer.log_probs)
    finally:
        first.close()
        second.close()


def test_every_stateful_part_of_recurrent_ppo_round_trips(tmp_path):
    from reliability.test_completeness import _equal, stateful_parts

    from rlloop.checkpoint import load_checkpoint, save_checkpoint

    first, second = _algo("seed=1"), _algo("seed=2")
    try:
        for algo in (first, second):
            Trainer(algo).step()
        Trainer(first).step()
        save_checkpoint(tmp_path / "ckpt", {"algorithm": first.get_state()})
        second.set_state(load_checkpoint(tmp_path / "ckpt").components["algorithm"])
        a, b = stateful_parts(first), stateful_parts(second)
        assert "algo.state" in a and "algo.starts" in a
        assert a.keys() == b.keys()
        missing = [k for k in a if not _equal(a[k], b[k])]
        assert not missing, f"not restored from the checkpoint: {missing}"
    finally:
        first.close()
        second.close()


def _checkpoint_leaves(run):
    from rlloop.checkpoint import CheckpointManager, load_checkpoint

    ckpt = load_checkpoint(CheckpointManager(run / "checkpoints").latest())
    out = {}

    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{path}/{k}")
        elif isinstance(node, list | tuple):
            for i, v in enumerate(node):
                walk(v, f"{path}/{i}")
        else:
            out[path] = node

    walk(ckpt.components, "")
    return out


RESUME_SETS = ["ppo.recurrent=lstm", "env.mask_velocity=true", "stop_on_solve=false",
               "num_envs=8", "ppo.rollout_steps=40", "ppo.seq_len=16",
               "ppo.minibatch_size=160", "eval_every=2"]


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b)
    return type(a) is type(b) and a == b


def _assert_resumed_equal(a_run, b_run, half_run_leaves):
    # The cut fell inside episodes, with memory that matters.
    assert bool((half_run_leaves["/algorithm/runner/episodes/lengths"] > 0).any())
    assert bool(half_run_leaves["/algorithm/recurrent/state"].abs().sum() > 0)
    a, b = _checkpoint_leaves(a_run), _checkpoint_leaves(b_run)
    assert a.keys() == b.keys()
    assert a["/trainer/counters/env/steps"] == 1920
    differ = [k for k in a if not _same(a[k], b[k]) and "time" not in k]
    assert not differ, differ


def _resume_config(steps):
    return build_config("ppo", "CartPole-v1", flags={"seed": 5}, sets=[
        *QUIET, *RESUME_SETS, f"total_env_steps={steps}"])


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    """The uncut recurrent run both resume tests compare with (trained once; only read)."""
    from rlloop.runs.start import train

    run = tmp_path_factory.mktemp("recurrent") / "a"
    train(_resume_config(1920), run)
    return run


def test_resume_cut_mid_episode_is_bit_exact(tmp_path, straight_run):
    from rlloop.runs.start import resume, train

    train(_resume_config(960), tmp_path / "b")
    half = _checkpoint_leaves(tmp_path / "b")
    resume(tmp_path / "b", total_env_steps=1920)
    _assert_resumed_equal(straight_run, tmp_path / "b", half)


@pytest.mark.slow
def test_resume_in_a_new_process_cut_mid_episode_is_bit_exact(tmp_path, cli_env, straight_run,
                                                              cli_in_process):
    """The cut run from the command line in this process, its resume in a new one."""
    sets = [x for s in [*QUIET, *RESUME_SETS] for x in ("--set", s)]
    cut = cli_in_process(["train", "ppo", "--env", "CartPole-v1", "--seed", "5", "--quiet",
                          *sets, "--total-env-steps", "960", "--run-dir", str(tmp_path / "b")])
    assert cut.returncode == 0, cut.stderr
    half = _checkpoint_leaves(tmp_path / "b")
    out = subprocess.run(rlloop_cmd("train", "ppo", "--resume", "b", "--total-env-steps", "1920"),
                         cwd=tmp_path, env=cli_env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    _assert_resumed_equal(straight_run, tmp_path / "b", half)


# ---- masked-velocity CartPole --------------------------------------------------------------
def test_masked_cartpole_shows_positions_only_on_both_backends():
    full, masked = CartPoleVecEnv(3, seed=4), CartPoleVecEnv(3, seed=4, mask_velocity=True)
    assert masked.spec.obs_shape == (2,) and env_spec(
        "CartPole-v1", env_kwargs={"mask_velocity": True}).obs_shape == (2,)
    assert torch.equal(masked.reset(), full.reset()[:, [0, 2]])
    for _ in range(30):
        actions = torch.randint(2, (3,))
        a, b = full.step(actions), masked.step(actions)
        assert torch.equal(b.obs, a.obs[:, [0, 2]])
        assert torch.equal(b.final_obs, a.final_obs[:, [0, 2]])
        assert torch.equal(b.terminated, a.terminated)

    gym_full = gymnasium.make("CartPole-v1")
    gym_masked = gymnasium.make(ENV_ID)
    assert isinstance(gym_masked.unwrapped, type(gym_full.unwrapped))
    assert gym_masked.observation_space.shape == (2,)
    assert gym_masked.spec is not None and gym_masked.spec.max_episode_steps == 500
    o_full, _ = gym_full.reset(seed=1)
    o_masked, _ = gym_masked.reset(seed=1)
    np.testing.assert_array_equal(o_masked, o_full[[0, 2]])
    for step in range(10):  # alternating pushes: no episode ends
        o_full, *_ = gym_full.step(step % 2)
        o_masked, *_ = gym_masked.step(step % 2)
        np.testing.assert_array_equal(o_masked, o_full[[0, 2]])
    env = make_env(f"rlloop.envs.masked_velocity:{ENV_ID}", 2, "gymnasium", seed=0)
    assert env.spec.obs_shape == (2,) and env.spec.reward_threshold == 475.0
    assert env.reset().shape == (2, 2)
    env.close()
    with pytest.raises(ValueError, match="flat Box"):
        MaskVelocity(gymnasium.make("FrozenLake-v1"))


# ---- bad input -----------------------------------------------------------------------------
@pytest.mark.parametrize("algo", ["dqn", "sac", "td3", "ma_ppo"])
def test_recurrent_settings_on_other_algorithms_name_the_fix(algo):
    with pytest.raises(ConfigError, match=rf"^{algo}.recurrent: {algo} has no recurrent "
                                          r"policy; use rlloop train ppo --set ppo.recurrent"):
        build_config(algo, sets=[f"{algo}.recurrent=lstm"])


def test_cli_refuses_recurrent_dqn_in_one_line(tmp_path, cli_env):
    out = subprocess.run(rlloop_cmd("train", "dqn", "--set", "dqn.recurrent=gru", "--quiet"),
                         cwd=tmp_path, env=cli_env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "rlloop: error: dqn.recurrent: dqn has no recurrent policy; use rlloop train ppo "
        "--set ppo.recurrent=lstm (or gru), or drop the setting"]


@pytest.mark.parametrize(("sets", "what"), [
    (["ppo.net=custom_nets:TinyEncoder"], "ppo.net"), (["ppo.use_sde=true"], "ppo.use_sde"),
])
def test_feed_forward_only_settings_beside_recurrent_are_refused(sets, what):
    """A custom network or gSDE beside ``ppo.recurrent`` trained without them, silently."""
    with pytest.raises(ConfigError, match=rf"^{what} works with feed-forward policies only; "
                                          rf"drop {what} or ppo.recurrent"):
        build_config("ppo", "Pendulum-v1", sets=["ppo.recurrent=gru", *sets])


def test_recurrent_settings_are_validated():
    config = build_config("ppo", sets=["ppo.recurrent=gru", "env.mask_velocity=true"])
    assert config.hparams.recurrent == "gru" and config.env_kwargs == {"mask_velocity": True}
    assert config.env == "CartPole-v1"  # env.X sets an env option, not the id
    with pytest.raises(ConfigError, match=r"ppo\.recurrent must be one of"):
        build_config("ppo", sets=["ppo.recurrent=rnn"])
    with pytest.raises(ConfigError, match=r"ppo\.seq_len must be > 0"):
        build_config("ppo", sets=["ppo.recurrent=gru", "ppo.seq_len=0"])


def test_samples_trained_count_real_steps_not_sequences_or_padding():
    algo = _algo("ppo.num_epochs=2")  # 4 envs x 40 steps in sequences of 16: 8 padded
    try:
        algo.collect()
        stats = algo.update(160)
        assert stats["learner/num_samples_trained"] == 2 * 4 * 40
    finally:
        algo.close()
