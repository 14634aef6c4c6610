"""Multi-agent: the PettingZoo adapter, turn-based GAE, masked policies, ma_ppo."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("pettingzoo")

from rlloop.algorithms.ma_ppo import MultiAgentPPO
from rlloop.checkpoint import load_checkpoint, save_checkpoint
from rlloop.config.loading import build_config
from rlloop.data.multi_agent import masked_gae
from rlloop.data.returns import gae
from rlloop.envs.core import Box, Discrete
from rlloop.envs.multi_agent import (
    AgentSpec,
    make_multi_agent_env,
    multi_agent_spec,
    random_actions,
)
from rlloop.envs.registry import env_spec, make_env
from rlloop.errors import EnvError
from rlloop.modules.masked import MaskedActorCritic
from rlloop.runners.multi_agent import RANDOM, evaluate_multi_agent
from rlloop.runs.build import build_algorithm
from rlloop.trainers.loop import Trainer

TTT = "pettingzoo:classic.tictactoe_v3"
RPS = "pettingzoo:classic.rps_v2"


# ---- the adapter ---------------------------------------------------------------------------
def test_parallel_env_batches_per_agent_and_resets_in_the_same_step():
    env = make_multi_agent_env(RPS, 3, seed=0, env_kwargs={"max_cycles": 4})
    assert env.agents == ("player_0", "player_1")
    spec = env.spec.agent_specs["player_0"]
    assert spec.obs_shape == (4,) and spec.action_space == Discrete(3)  # one-hot Discrete(4)
    obs = env.reset(seed=1)
    assert obs["player_0"].shape == (3, 4) and bool(obs["player_0"].sum(1).eq(1).all())
    assert all(bool(a.all()) for a in env.active.values())  # everyone acts every step
    rock = torch.zeros(3, dtype=torch.int64)
    paper = torch.ones(3, dtype=torch.int64)
    for t in range(4):
        res = env.step({"player_0": paper, "player_1": rock})
        assert torch.equal(res.reward["player_0"], torch.ones(3))  # paper beats rock
        assert torch.equal(res.reward["player_1"], -torch.ones(3))
        last = t == 3
        assert bool(res.episode_over.all()) == last
        assert bool(res.truncated["player_0"].all()) == last  # cut by max_cycles ...
        assert not bool(res.terminated["player_0"].any())  # ... never terminal
    # the reset happened in the same step: obs is a fresh episode's, final_obs the last one
    assert torch.equal(res.final_obs["player_0"][:, 0], torch.ones(3))  # saw opponent's rock
    assert not torch.equal(res.obs["player_0"], res.final_obs["player_0"])
    env.close()


def test_turn_based_game_masks_actions_and_activity():
    env = make_multi_agent_env(TTT, 4, seed=0)
    spec = env.spec.agent_specs["player_1"]
    assert spec.action_mask == 9 and spec.obs_shape == (3 * 3 * 2 + 9,)
    obs = env.reset()
    assert bool(env.active["player_1"].all()) and not bool(env.active["player_2"].any())
    g = torch.Generator().manual_seed(0)
    finished = 0
    for _ in range(60):
        actions = {a: random_actions(env.spec.agent_specs[a], obs[a], g) for a in env.agents}
        for a in env.agents:  # random players only choose legal moves
            legal = obs[a][:, -9:].gather(1, actions[a][:, None]).squeeze(1)
            assert bool(legal[env.active[a]].eq(1).all())
        before = dict(env.active)
        res = env.step(actions)
        assert bool((before["player_1"] ^ before["player_2"]).all())  # exactly one moves
        over = res.episode_over
        finished += int(over.sum())
        # a game ends for both players at once, zero-sum, and the new game starts with p1
        assert torch.equal(res.terminated["player_1"], over)
        assert torch.equal(res.reward["player_1"] + res.reward["player_2"], torch.zeros(4))
        assert bool(env.active["player_1"][over].all())
        obs = res.obs
    assert finished >= 15
    env.close()


def test_env_ids_and_errors():
    assert env_spec(TTT).action_space == Discrete(9)
    assert multi_agent_spec(RPS).agents == ("player_0", "player_1")
    with pytest.raises(EnvError, match="rlloop train ma_ppo"):
        make_env(TTT, 2)
    with pytest.raises(EnvError, match="unknown PettingZoo env"):
        make_multi_agent_env("pettingzoo:classic.no_such_game_v0", 1)
    with pytest.raises(EnvError, match="mpe2"):  # MPE moved to its own package
        make_multi_agent_env("pettingzoo:mpe.simple_spread_v3", 1)


# ---- turn-based advantages and masked policies ---------------------------------------------
def test_masked_gae_is_gae_when_every_step_is_active():
    g = torch.Generator().manual_seed(0)
    t, n = 12, 5
    rewards, values = torch.randn(t, n, generator=g), torch.randn(t, n, generator=g)
    final_values, last = torch.randn(t, n, generator=g), torch.randn(n, generator=g)
    terminated = torch.rand(t, n, generator=g) < 0.15
    truncated = (torch.rand(t, n, generator=g) < 0.15) & ~terminated
    next_values = torch.cat([values[1:], last[None]])
    next_values = torch.where(truncated, final_values, next_values)
    expected = gae(rewards, values, next_values, terminated, truncated, 0.97, 0.9)
    got = masked_gae(rewards, values, final_values, last, terminated, truncated,
                     torch.ones(t, n, dtype=torch.bool), 0.97, 0.9)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_masked_gae_credits_the_opponents_turn_to_the_agents_last_move():
    # the agent moves at t=0 and t=2; the opponent wins at t=3 (reward -1, terminal)
    gamma, lam = 0.9, 0.8
    values = torch.tensor([[0.5], [9.0], [0.2], [9.0]])  # 9: never read (not the agent's turn)
    rewards = torch.tensor([[0.0], [0.0], [0.0], [-1.0]])
    terminated = torch.tensor([[False], [False], [False], [True]])
    active = torch.tensor([[True], [False], [True], [False]])
    adv, ret = masked_gae(rewards, values, torch.zeros(4, 1), torch.zeros(1), terminated,
                          torch.zeros(4, 1, dtype=torch.bool), active, gamma, lam)
    a2 = -1.0 - 0.2
    a0 = (0.0 + gamma * 0.2 - 0.5) + gamma * lam * a2
    torch.testing.assert_close(adv[:, 0], torch.tensor([a0, 0.0, a2, 0.0]))
    torch.testing.assert_close(ret[[0, 2], 0], torch.tensor([a0 + 0.5, -1.0]))


def test_masked_policy_never_picks_illegal_moves():
    torch.manual_seed(0)
    module = MaskedActorCritic((5 + 3,), Discrete(3), mask_dims=3, hidden=(8,))
    obs = torch.randn(200, 8)
    obs[:, 5:] = (torch.rand(200, 3) < 0.5).float()
    obs[:10, 5:] = 0.0  # not this agent's turn: any action is fine, and nothing is NaN
    actions, log_probs = module.act(obs, generator=torch.Generator().manual_seed(1))
    legal = obs[10:, 5:].gather(1, actions[10:, None]).squeeze(1)
    assert bool((legal == 1)[obs[10:, 5:].sum(1) > 0].all())
    assert bool(torch.isfinite(log_probs).all())
    assert bool(torch.isfinite(module.dist(obs).entropy()).all())


# ---- ma_ppo --------------------------------------------------------------------------------
def _config(*sets, env=TTT, steps=None):
    flags = {"total_env_steps": steps} if steps else None
    return build_config("ma_ppo", env, flags=flags, sets=[
        "mlflow=false", "progress=false", "num_envs=4", "ma_ppo.rollout_steps=16",
        "ma_ppo.minibatch_size=32", *sets])


def test_independent_modules_and_policies_to_train():
    algo = build_algorithm(_config("ma_ppo.policy_mapping=independent",
                                   "ma_ppo.policies_to_train=[player_1]"))
    assert isinstance(algo, MultiAgentPPO)
    assert set(algo.learner.modules) == {"player_1", "player_2"}
    frozen = {k: v.clone() for k, v in algo.learner.modules["player_2"].state_dict().items()}
    trainer = Trainer(algo, eval_episodes=8)
    for _ in range(3):
        stats = trainer.step()
    for k, v in algo.learner.modules["player_2"].state_dict().items():
        assert torch.equal(v, frozen[k])
    assert "player_1/losses/policy" in stats and "player_2/losses/policy" not in stats
    assert {"episode/player_1/return_mean", "episode/player_2/return_mean"} <= set(stats)
    out = trainer.eval()
    assert out["eval/episodes"] == 8
    assert {"eval/player_1/return_mean", "eval/player_2/return_mean"} <= set(out)
    algo.close()


def test_shared_policy_acts_for_every_agent():
    algo = build_algorithm(_config(env=RPS))
    assert set(algo.learner.modules) == {"default_policy"}
    stats = Trainer(algo).step()
    # both players' samples train the one module: 16 steps x 4 envs x 2 agents, each epoch
    epochs = algo.config.num_epochs
    assert stats["default_policy/num_samples_trained_lifetime"] == 16 * 4 * 2 * epochs
    assert "losses/policy" in stats  # one module: flat keys, as single-agent PPO
    algo.close()


def test_bad_multi_agent_configs_are_typed_errors():
    from rlloop.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown modules"):
        build_algorithm(_config("ma_ppo.policies_to_train=[nobody]"))
    with pytest.raises(ConfigError, match="league_every must be >= 0"):
        _config("ma_ppo.league_every=-1")
    with pytest.raises(ConfigError, match="normalise"):
        _config("ma_ppo.normalize_obs=true")
    with pytest.raises(EnvError, match="rlloop train ma_ppo"):
        build_algorithm(build_config("ppo", TTT, sets=["mlflow=false"]))
    with pytest.raises(ConfigError, match="--backend gymnasium does not apply"):
        build_algorithm(_config("backend=gymnasium"))  # was recorded and not used


def test_independent_modules_take_agents_with_other_observation_shapes():
    """The first update fed agent b's 5-wide observations of a placeholder row (tagged
    module 0) to agent a's 3-wide network: 'mat1 and mat2 shapes cannot be multiplied'."""
    algo = build_algorithm(_config("ma_ppo.policy_mapping=independent", "env_kwargs.wide_b=true",
                                   env="pettingzoo:ma_envs"))
    assert {a: s.obs_shape for a, s in algo.spec.agent_specs.items()} == {"a": (3,), "b": (5,)}
    trainer = Trainer(algo, eval_episodes=2)
    before = {k: [p.clone() for p in m.parameters()] for k, m in algo.learner.modules.items()}
    stats = trainer.step()
    assert {"a/losses/policy", "b/losses/policy"} <= set(stats)
    for k, m in algo.learner.modules.items():  # both modules trained
        assert any(not torch.equal(p, q) for p, q in zip(m.parameters(), before[k], strict=True))
    algo.close()


def test_ma_ppo_refuses_action_spaces_and_leagues_it_cannot_train():
    from rlloop.errors import ConfigError

    with pytest.raises(EnvError, match=r"MultiDiscrete\(\[2 3\]\) is not supported by ma_ppo"):
        build_algorithm(_config("env_kwargs.multi_discrete=true", env="pettingzoo:ma_envs"))
    # The league's advice was policy_mapping=independent, which a league ignored.
    with pytest.raises(ConfigError, match=r"drop ma_ppo\.league_every or "
                                          r"ma_ppo\.policy_mapping=independent"):
        _config("ma_ppo.league_every=2", "ma_ppo.policy_mapping=independent")
    with pytest.raises(ConfigError, match="a self-play league needs agents with the same "
                                          "spaces"):
        build_algorithm(_config("ma_ppo.league_every=2", "env_kwargs.wide_b=true",
                                env="pettingzoo:ma_envs"))


def test_state_round_trips_through_a_checkpoint(tmp_path):
    first = build_algorithm(_config("ma_ppo.policy_mapping=independent", "seed=1"))
    Trainer(first).step()
    Trainer(first).step()
    save_checkpoint(tmp_path / "ckpt", {"algorithm": first.get_state()})
    second = build_algorithm(_config("ma_ppo.policy_mapping=independent", "seed=2"))
    second.set_state(load_checkpoint(tmp_path / "ckpt").components["algorithm"])
    for m in ("player_1", "player_2"):
        for p, q in zip(first.learner.modules[m].parameters(),
                        second.learner.modules[m].parameters(), strict=True):
            assert torch.equal(p, q)
        s1 = first.learner.get_optimizer(m).state_dict()["state"]
        s2 = second.learner.get_optimizer(m).state_dict()["state"]
        assert all(torch.equal(s1[i]["exp_avg_sq"], s2[i]["exp_avg_sq"]) for i in s1)
    assert torch.equal(first.generator.get_state(), second.generator.get_state())
    assert first.runner.episodes == second.runner.episodes
    first.close()
    second.close()


def test_random_players_are_even_in_a_symmetric_evaluation():
    env = make_multi_agent_env(TTT, 8, seed=0)
    out = evaluate_multi_agent(env, lambda m, o: (_ for _ in ()).throw(AssertionError(m)),
                               lambda a: RANDOM, RANDOM, 400, torch.Generator().manual_seed(0))
    assert out["episodes"] == 400
    assert abs(out["return_mean"]) < 0.12  # seats alternate, so first-move luck cancels
    env.close()


def test_cli_trains_a_multi_agent_run(tmp_path, monkeypatch, caplog, cli_in_process):
    monkeypatch.chdir(tmp_path)
    out = cli_in_process([
        "train", "ma_ppo", "--env", TTT, "--total-env-steps", "512", "--num-envs", "4",
        "--run-dir", "run", "--quiet", "--set", "mlflow=false",
        "--set", "ma_ppo.policy_mapping=independent", "--set", "ma_ppo.minibatch_size=64"])
    assert out.returncode == 0, out.stderr
    assert "mlflow ui" not in out.stdout  # mlflow=false: there is no store to open
    # The end-of-run video is skipped with a reason, not with advice to run what just ran.
    # (logged: a real process prints it on stderr, in this one pytest captures the record)
    warned = out.stderr + caplog.text
    assert "single-agent runs only" in warned and "rlloop train" not in warned
    ev = cli_in_process(["eval", "run", "--episodes", "10", "--json"])
    assert ev.returncode == 0, ev.stderr
    assert '"episodes": 10' in ev.stdout
    bad = cli_in_process(["train", "ppo", "--env", TTT, "--quiet"])
    assert bad.returncode == 2 and "ma_ppo" in bad.stderr


def test_random_actions_of_an_unbounded_box_are_finite():
    """The random evaluation opponent (and warm-up) draw from Gymnasium's Box convention:
    normal where a dimension is unbounded, exponential tails where one bound is missing;
    low + u * (high - low) gave NaN there."""
    inf = float("inf")
    spec = AgentSpec((2,), Box(low=(-1.0, -inf, 0.0), high=(1.0, inf, inf), shape=(3,)))
    actions = random_actions(spec, torch.zeros(4096, 2), torch.Generator().manual_seed(0))
    assert actions.isfinite().all()
    assert actions[:, 0].abs().max() <= 1.0 and actions[:, 2].min() >= 0.0
    assert abs(float(actions[:, 1].std()) - 1.0) < 0.1


def test_a_turn_based_game_without_masks_has_one_agent_to_move_per_step():
    """Only the mover's action counts in a turn-based game: without an action mask to
    tell, the AEC env's agent_selection does (every agent was active, and trained on
    actions the game ignored)."""
    env = make_multi_agent_env("pettingzoo:turn_envs", 2, seed=0)
    try:
        env.reset()
        for t in range(8):
            movers = torch.stack([env.active["a"], env.active["b"]])
            assert movers.sum(0).eq(1).all(), (t, movers)
            assert bool(env.active["a"][0]) == (t % 4 in (0, 2))  # a opens every game
            env.step({a: torch.ones(2, dtype=torch.int64) for a in env.agents})
    finally:
        env.close()


def _scripted(moves: list[int]):  # type: ignore[no-untyped-def]
    """A policy playing ``moves`` in turn (one call per env step, one module for both)."""
    count = {"i": 0}

    def policy(module_id: str, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        action = torch.full((obs.shape[0],), moves[count["i"] % len(moves)])
        count["i"] += 1
        return action, torch.zeros(obs.shape[0])

    return policy


def test_a_loss_told_after_the_rollout_ends_reaches_the_losing_move():
    """Tic-tac-toe split 4 | 1 steps: player_2's second move ends rollout 0 while it waits
    for its turn; the -1 it is told in rollout 1 (when player_1 wins) is that move's return
    (gamma = lambda = 1). Before, the -1 was dropped and the move bootstrapped from an
    off-turn observation, whose value the critic never learns."""
    algorithm = build_algorithm(build_config("ma_ppo", "pettingzoo:classic.tictactoe_v3", sets=[
        "mlflow=false", "progress=false", "num_envs=1", "ma_ppo.rollout_steps=4",
        "ma_ppo.minibatch_size=4", "ma_ppo.gamma=1.0", "ma_ppo.gae_lambda=1.0"]))
    try:
        policy = _scripted([0, 3, 1, 4, 2, 5, 6, 7, 8])  # player_1 wins at step 4
        batches = []
        for _ in range(2):
            algorithm.runner.collect(policy, algorithm.rollout, algorithm.generator)
            if not batches:
                losing_move = algorithm.rollout["player_2"].obs[3, 0].clone()
            batches.append(algorithm._batch()["default_policy"])
        # rollout 0 trains player_1's two moves and player_2's first; its second waits
        assert len(batches[0].returns) == 3
        # rollout 1 trains the waiting move: told -1, the game over
        [row] = (batches[1].obs == losing_move).all(-1).nonzero().flatten().tolist()
        assert float(batches[1].returns[row]) == -1.0
        # no trained row was an off-turn observation (tic-tac-toe's legal-move mask empty)
        for batch in batches:
            assert (batch.obs[:, -9:].sum(-1) > 0).all()
    finally:
        algorithm.close()


def test_turn_based_returns_discount_by_gamma_per_own_move():
    """gamma 0.9, lambda 1: returns are each player's discounted outcome, counted in its own
    moves. Player_1 wins on its third move (+1: 0.81, 0.9, 1); player_2 loses after its
    second (-1: -0.9, -1). Swapping gamma and lambda would make them the critic's guesses."""
    algorithm = build_algorithm(build_config("ma_ppo", "pettingzoo:classic.tictactoe_v3", sets=[
        "mlflow=false", "progress=false", "num_envs=1", "ma_ppo.rollout_steps=5",
        "ma_ppo.minibatch_size=5", "ma_ppo.gamma=0.9", "ma_ppo.gae_lambda=1.0"]))
    try:
        policy = _scripted([0, 3, 1, 4, 2, 5, 6, 7, 8])  # player_1 wins at step 4
        algorithm.runner.collect(policy, algorithm.rollout, algorithm.generator)
        returns = algorithm._batch()["default_policy"].returns
        torch.testing.assert_close(returns, torch.tensor([0.81, 0.9, 1.0, -0.9, -1.0]))
    finally:
        algorithm.close()
