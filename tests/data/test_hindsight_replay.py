"""Hindsight replay against Stable-Baselines3's ``HerReplayBuffer`` on the same episodes.

Both buffers get the same stream of env steps (several envs in lockstep, episodes of
random lengths that end by termination or truncation, a capacity small enough to wrap).
Sampling is random, so the comparison takes SB3's own draws (which transitions, which
goal index in the episode) and asks rlloop's buffer for the same ones: every field of the
batch must be equal, and rlloop's goal draws must span SB3's range for each transition.
With normalisation (SB3's buffer sampled with a ``VecNormalize`` env, rlloop's batch
through a ``ReplayNormalizer``, each set of statistics fed the same steps by its own code)
the relabelled batches are standardised alike, to float32 rounding.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlloop.data.hindsight_replay import HindsightReplayBuffer
from rlloop.data.obs_storage import ObsLayout
from rlloop.data.replay_normalization import ReplayNormalizer
from rlloop.data.transitions import Transitions
from rlloop.envs.normalizer import RunningMeanStd

sb3_her = pytest.importorskip("stable_baselines3.her.her_replay_buffer")
sb3_vec_env = pytest.importorskip("stable_baselines3.common.vec_env")

G, OBS, ACT = 3, 2, 2  # goal, observation and action widths
KEYS = (("achieved_goal", (G,)), ("desired_goal", (G,)), ("observation", (OBS,)))
LAYOUT = ObsLayout(tuple((k, s, torch.float32) for k, s in KEYS))


def goal_reward(achieved: np.ndarray, desired: np.ndarray) -> np.ndarray:
    """A reward that tells goals apart finely: minus the rounded L1 distance."""
    return -np.round(np.abs(np.asarray(achieved) - np.asarray(desired)).sum(-1), 3)


def torch_reward(achieved: torch.Tensor, desired: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(goal_reward(achieved.numpy(), desired.numpy()), dtype=torch.float32)


def info_reward(achieved: np.ndarray, desired: np.ndarray, infos) -> np.ndarray:
    """A reward that reads each row's info: a weight per step, an offset of the achieved
    goal ([G]), and a bonus in a nested dict that only some steps give."""
    weight = np.array([i["weight"] for i in infos])
    offset = np.stack([i["offset"] for i in infos])
    bonus = np.array([i["extra"]["bonus"] if "extra" in i else 0.0 for i in infos])
    shifted = np.asarray(achieved, dtype=np.float64) + offset
    return -np.round(np.abs(shifted - np.asarray(desired)).sum(-1) * weight, 3) + bonus


def torch_info_reward(achieved: torch.Tensor, desired: torch.Tensor, infos) -> torch.Tensor:
    return torch.as_tensor(info_reward(achieved.numpy(), desired.numpy(), infos),
                           dtype=torch.float32)


class RewardEnv:
    """What SB3's buffer calls: ``env_method("compute_reward", ...)`` of a VecEnv."""

    def __init__(self, reads_infos: bool = False) -> None:
        self.reads_infos = reads_infos

    def env_method(self, name, achieved, desired, infos, indices=None):
        assert name == "compute_reward"
        if self.reads_infos:
            return [info_reward(achieved, desired, infos)]
        return [goal_reward(achieved, desired)]


@dataclasses.dataclass
class Step:
    obs: dict[str, np.ndarray]
    next_obs: dict[str, np.ndarray]
    action: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray


def steps(num_envs: int, count: int, seed: int = 0) -> Iterator[Step]:
    """Env steps of ``num_envs`` envs: random observations, episodes of 1 to 6 steps that
    end by termination or (a third of them) truncation."""
    rng = np.random.default_rng(seed)

    def obs():
        return {k: rng.normal(size=(num_envs, *s)).astype(np.float32) for k, s in KEYS}

    current, left = obs(), rng.integers(1, 7, num_envs)
    for _ in range(count):
        nxt = obs()
        nxt["desired_goal"] = current["desired_goal"].copy()  # a goal lasts its episode
        left -= 1
        done = left == 0
        truncated = done & (rng.random(num_envs) < 1 / 3)
        yield Step(current, nxt, rng.uniform(-1, 1, (num_envs, ACT)).astype(np.float32),
                   rng.normal(size=num_envs).astype(np.float32), done & ~truncated, truncated)
        current = {k: v.copy() for k, v in nxt.items()}
        fresh = obs()
        for k in current:
            current[k][done] = fresh[k][done]
        left[done] = rng.integers(1, 7, int(done.sum()))


def flat(obs: dict[str, np.ndarray]) -> torch.Tensor:
    return torch.as_tensor(np.concatenate([obs[k] for k, _ in KEYS], axis=1))


def step_infos(num_envs: int, count: int, seed: int = 1) -> Iterator[list[dict]]:
    """Each step's info dicts: a weight and an offset always, a nested bonus sometimes."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        infos = [{"weight": float(rng.uniform(0.5, 2.0)), "offset": rng.normal(size=G)}
                 for _ in range(num_envs)]
        for info in infos:
            if rng.random() < 0.5:
                info["extra"] = {"bonus": float(rng.integers(1, 4))}
        yield infos


def buffers(strategy: str, num_envs: int = 3, capacity: int = 60, count: int = 47,
            n_sampled_goal: int = 4, copy_info: bool = False, infos_late: bool = False):
    """SB3's buffer and rlloop's, fed the same ``count`` env steps; ``copy_info``: a
    reward that reads the steps' infos, kept by both (SB3's ``copy_info_dict=True``);
    ``infos_late`` (a planted error): rlloop's buffer gets each step's infos one step late."""
    space = spaces.Dict({k: spaces.Box(-np.inf, np.inf, s, np.float32) for k, s in KEYS})
    theirs = sb3_her.HerReplayBuffer(
        capacity, space, spaces.Box(-1, 1, (ACT,), np.float32), RewardEnv(copy_info),
        device="cpu", n_envs=num_envs, n_sampled_goal=n_sampled_goal,
        goal_selection_strategy=strategy, copy_info_dict=copy_info)
    ours = HindsightReplayBuffer(capacity, num_envs, LAYOUT, (ACT,), torch.float32,
                                 torch_info_reward if copy_info else torch_reward,
                                 n_sampled_goal, strategy, keep_infos=copy_info)  # type: ignore[arg-type]
    before = [{"weight": 1.0, "offset": np.zeros(G)}] * num_envs
    for s, infos in zip(steps(num_envs, count), step_infos(num_envs, count), strict=True):
        done = s.terminated | s.truncated
        infos = [{**i, "TimeLimit.truncated": bool(t)} for i, t in zip(infos, s.truncated,
                                                                       strict=True)]
        theirs.add(s.obs, s.next_obs, s.action, s.reward, done, infos)
        batch = Transitions(flat(s.obs), torch.as_tensor(s.action), torch.as_tensor(s.reward),
                            flat(s.next_obs), torch.as_tensor(s.terminated),
                            torch.full((num_envs,), 0.99))
        if copy_info:
            ours.add(batch, before if infos_late else infos)
            before = infos
        else:
            ours.add(batch)
        ours.end_episodes(torch.as_tensor(done))
    return theirs, ours


def sb3_sample(buffer, batch_size: int, seed: int, env=None):
    """SB3's batch (normalised by ``env``, a ``VecNormalize``, if given) and its draws: the
    transitions (rows, envs) and, per relabelled one, the bounds and result of its
    goal-index draw (``final`` draws none)."""
    np.random.seed(seed)
    drawn: dict[str, list] = {"choice": [], "randint": []}
    real_choice, real_randint = np.random.choice, np.random.randint

    def choice(*args, **kwargs):
        out = real_choice(*args, **kwargs)
        drawn["choice"].append(out)
        return out

    def randint(low, high=None, *args, **kwargs):
        out = real_randint(low, high, *args, **kwargs)
        drawn["randint"].append((np.broadcast_to(low, np.shape(out)), high, out))
        return out

    np.random.choice, np.random.randint = choice, randint  # type: ignore[assignment]
    try:
        batch = buffer.sample(batch_size, env)
    finally:
        np.random.choice, np.random.randint = real_choice, real_randint
    rows, envs = np.unravel_index(drawn["choice"][0], buffer.ep_length.shape)
    return batch, rows, envs, drawn["randint"]


def assert_batches_equal(ours: Transitions, theirs, exact: bool = True) -> None:
    """Every field equal; with ``exact=False`` observations and rewards to float32
    rounding (standardised in float32 here, in float64 and then rounded by SB3)."""
    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        return torch.equal(a, b) if exact else torch.allclose(a, b, rtol=1e-6, atol=1e-6)

    obs = dict(LAYOUT.split(ours.obs))
    next_obs = dict(LAYOUT.split(ours.next_obs))
    for key, _ in KEYS:
        assert same(obs[key], theirs.observations[key]), key
        assert same(next_obs[key], theirs.next_observations[key]), key
    assert torch.equal(ours.action, theirs.actions)
    assert same(ours.reward, theirs.rewards.reshape(-1))
    assert torch.equal(ours.terminated.float(), theirs.dones.reshape(-1))


def compare(theirs, ours: HindsightReplayBuffer, batch_size: int = 256, seed: int = 0,
            normalized: tuple[Any, ReplayNormalizer] | None = None) -> None:
    """rlloop's buffer, asked for SB3's draws, gives SB3's batch; its own goal draws
    span the range SB3 draws from. ``normalized``: SB3's batch sampled with the
    ``VecNormalize`` env, rlloop's standardised by the ``ReplayNormalizer``."""
    vec_normalize, normalizer = normalized or (None, None)
    batch, rows, envs, goal_draws = sb3_sample(theirs, batch_size, seed, vec_normalize)
    row, env = torch.as_tensor(rows), torch.as_tensor(envs)
    n_virtual = int(theirs.her_ratio * batch_size)
    if ours.strategy == "final":
        goal_step = ours.goal_steps(row, env, torch.zeros(batch_size, dtype=torch.float64))
    else:
        (low, high, out), = goal_draws
        lowest = ours.goal_steps(row, env, torch.zeros(batch_size, dtype=torch.float64))
        highest = ours.goal_steps(row, env, torch.full((batch_size,), 1 - 2**-40,
                                                       dtype=torch.float64))
        assert torch.equal(lowest[:n_virtual], torch.as_tensor(np.array(low)))
        assert torch.equal(highest[:n_virtual], torch.as_tensor(high) - 1)
        goal_step = torch.cat([torch.as_tensor(out), lowest[n_virtual:]])
    # SB3 draws the relabelled ones first and returns them last: same rows, rolled
    order = torch.cat([torch.arange(n_virtual, batch_size), torch.arange(n_virtual)])
    mine = ours.relabelled(row, env, goal_step[:n_virtual]).select(order)
    if normalizer is None:
        assert_batches_equal(mine, batch)
    else:
        assert_batches_equal(normalizer.batch(mine), batch, exact=False)


@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
def test_batches_equal_sb3s_for_its_draws(strategy: str) -> None:
    theirs, ours = buffers(strategy)  # 47 steps into 20 rows per env: wrapped twice
    assert torch.equal(ours.sampleable(), torch.as_tensor(theirs.ep_length > 0))
    compare(theirs, ours)


def test_an_unwrapped_buffer_and_one_relabelled_goal_per_real_transition() -> None:
    theirs, ours = buffers("future", num_envs=2, capacity=400, count=50, n_sampled_goal=1)
    assert torch.equal(ours.sampleable(), torch.as_tensor(theirs.ep_length > 0))
    compare(theirs, ours, batch_size=101, seed=3)


@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
def test_rewards_that_read_infos_equal_sb3s_copy_info_dict(strategy: str) -> None:
    theirs, ours = buffers(strategy, copy_info=True)
    compare(theirs, ours)
    row, env = torch.tensor([5, 19, 0]), torch.tensor([2, 0, 1])
    # what compute_reward gets: SB3's form (an object array of dicts), the values given
    kept, given = ours.infos.read(row, env), theirs.infos[row.numpy(), env.numpy()]
    assert kept.dtype == given.dtype == np.dtype(object)
    for a, b in zip(kept, given, strict=True):
        assert a.keys() == b.keys()
        assert all(np.array_equal(a[k], b[k]) for k in a if k != "extra")
        assert a.get("extra") == b.get("extra")


def test_the_comparison_catches_infos_of_the_wrong_step() -> None:
    theirs, ours = buffers("future", copy_info=True, infos_late=True)
    with pytest.raises(AssertionError):
        compare(theirs, ours)


def test_infos_that_cannot_be_stored_are_named() -> None:
    from rlloop.data.info_storage import InfoStore, UnstorableInfo
    store = InfoStore(4, 2, torch.device("cpu"))
    store.write(0, [{"a": 1.5, "b": np.zeros(2)}, {"a": 2.0, "n": 3}])
    with pytest.raises(UnstorableInfo, match=r"info\['name'\] is a str, and only numbers"):
        store.write(1, [{"name": "x"}, {}])
    with pytest.raises(UnstorableInfo, match=r"info\['b'\] was \(2,\) float64 and is now "
                                             r"\(3,\) float64; give each entry one shape"):
        store.write(1, [{}, {"b": np.zeros(3)}])
    with pytest.raises(UnstorableInfo, match=r"info\['n'\] was \(\) int64 and is now "
                                             r"\(\) float64"):
        store.write(1, [{"n": 0.5}, {}])
    kept = store.read(torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 0, 1]))
    assert [{k: np.asarray(v).tolist() for k, v in info.items()} for info in kept] == [
        {"a": 1.5, "b": [0.0, 0.0]}, {"a": 2.0, "n": 3}, {}, {}]  # nothing refused kept


def test_the_comparison_catches_a_goal_from_the_past() -> None:
    theirs, ours = buffers("future")
    ours.strategy = "episode"  # goals from anywhere in the episode, earlier steps included
    with pytest.raises(AssertionError):
        compare(theirs, ours)


def test_the_comparison_catches_rewards_not_recomputed() -> None:
    theirs, ours = buffers("final")
    relabelled = ours.relabelled

    def stale_rewards(row, env, goal_step):  # the goals replaced, the rewards kept
        return dataclasses.replace(relabelled(row, env, goal_step),
                                   reward=ours._fields["reward"][row, env])

    ours.relabelled = stale_rewards  # type: ignore[method-assign]
    with pytest.raises(AssertionError):
        compare(theirs, ours)


class SpaceOnly(gymnasium.Env):  # type: ignore[type-arg]
    """An env with the test's spaces, for the ``VecEnv`` under SB3's ``VecNormalize``."""

    observation_space = spaces.Dict({k: spaces.Box(-np.inf, np.inf, s, np.float32)
                                     for k, s in KEYS})
    action_space = spaces.Box(-1, 1, (ACT,), np.float32)


class ScriptedVecEnv(sb3_vec_env.DummyVecEnv):
    """Steps return what ``scripted`` holds: ``(obs, rewards, dones, infos)``."""

    scripted: tuple[Any, ...] = ()

    def step_wait(self):
        return self.scripted


GAMMA = 0.95


def normalized_buffers(strategy: str, num_envs: int = 3, count: int = 47,
                       goals_swapped: bool = False):
    """:func:`buffers`, and beside SB3's a ``VecNormalize`` and beside rlloop's a
    ``ReplayNormalizer``, each fed the same steps by its own code: every step's reward and
    done flags and the observations the envs return (a finished episode's reset one).
    ``goals_swapped`` (a planted error): rlloop's statistics see each row's achieved goal
    where its desired goal goes, and the other way round."""
    theirs, ours = buffers(strategy, num_envs, count=count)
    vec_normalize = sb3_vec_env.VecNormalize(
        ScriptedVecEnv([SpaceOnly] * num_envs), gamma=GAMMA)
    width = sum(math.prod(shape) for _, shape in KEYS)
    normalizer = ReplayNormalizer(num_envs, GAMMA, RunningMeanStd((width,)), True)
    # SB3's statistics start from a count of 1e-4, rlloop's from 1e-8: start them alike
    normalizer.obs_stats.count = normalizer.reward_stats.count = 1e-4  # type: ignore[union-attr]
    # the first ``count`` steps are those buffers() added; ``after``: the step that follows
    for s, after in pairwise(steps(num_envs, count + 1)):
        done = s.terminated | s.truncated
        vec_normalize.venv.scripted = (after.obs, s.reward, done, [{}] * num_envs)
        vec_normalize.step(s.action)
        seen = after.obs if not goals_swapped else {
            **after.obs, "achieved_goal": after.obs["desired_goal"],
            "desired_goal": after.obs["achieved_goal"]}
        normalizer.observe(torch.as_tensor(s.reward), torch.as_tensor(done), flat(seen))
    return theirs, ours, (vec_normalize, normalizer)


@pytest.mark.parametrize("strategy", ["future", "final"])
def test_normalised_batches_equal_sb3s_with_vec_normalize(strategy: str) -> None:
    """The replay keeps raw rows: goals are relabelled and rewards recomputed on raw
    goals, then observations are standardised per entry and rewards divided by the
    return's std, as SB3's buffer does with a VecNormalize env."""
    theirs, ours, normalized = normalized_buffers(strategy)
    vec_normalize, normalizer = normalized
    stats = normalizer.obs_stats
    assert stats is not None and normalizer.reward_stats is not None
    for key, mean in LAYOUT.split(stats.mean):  # one row's statistics are each entry's own
        peer = vec_normalize.obs_rms[key]
        torch.testing.assert_close(mean, torch.as_tensor(peer.mean), rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(dict(LAYOUT.split(stats.var))[key],
                                   torch.as_tensor(peer.var), rtol=1e-6, atol=1e-7)
    assert normalizer.reward_stats.var.item() == pytest.approx(vec_normalize.ret_rms.var,
                                                               rel=1e-12)
    assert normalizer.reward_stats.var.item() > 1.5  # rewards are scaled, not left as they are
    compare(theirs, ours, normalized=normalized)


def test_the_comparison_catches_statistics_of_the_wrong_entries() -> None:
    theirs, ours, normalized = normalized_buffers("future", goals_swapped=True)
    with pytest.raises(AssertionError):
        compare(theirs, ours, normalized=normalized)


def test_the_comparison_catches_rows_standardised_before_they_are_relabelled() -> None:
    theirs, ours, normalized = normalized_buffers("future")
    stats = normalized[1].obs_stats
    assert stats is not None
    for store in (ours.obs, ours.next_obs):  # a goal achieved, standardised as one
        store[:] = stats.normalize(store[:])
    normalized[1].obs_stats = None  # (and the batch not standardised again)
    with pytest.raises(AssertionError):
        compare(theirs, ours, normalized=normalized)


def test_own_draws_follow_the_strategy_and_the_ratio() -> None:
    _, ours = buffers("future")
    g = torch.Generator().manual_seed(0)
    batch = ours.sample(5000, g)
    row, env = batch.indices // 3, batch.indices % 3
    assert ours.sampleable()[row, env].all()  # finished, still held episodes only
    n_virtual = int(0.8 * 5000)
    obs = dict(LAYOUT.split(batch.obs))
    kept = torch.equal(obs["desired_goal"][n_virtual:],
                       ours.obs.tensors["desired_goal"][row, env][n_virtual:])
    assert kept  # real transitions keep their goal
    # a relabelled goal is the achieved goal after a step of the same episode, not earlier
    start, length, step = ours._episodes(row, env)
    goals = ours.next_obs.tensors["achieved_goal"][:, :, None]  # [rows, N, 1, G]
    achieved = goals[(start[:, None] + torch.arange(6)) % ours.rows, env[:, None], 0]
    match = (achieved == obs["desired_goal"][:, None]).all(-1)  # [B, 6]
    index = match.float().argmax(1)
    virtual = slice(0, n_virtual)
    assert match[virtual].any(1).all()
    assert (index[virtual] >= step[virtual] - start[virtual]).all()
    assert (index[virtual] < length[virtual]).all()
    # and all of [t, L) are drawn: the final step as often as the current one, roughly
    last = index[virtual] == length[virtual] - 1
    first = index[virtual] == step[virtual] - start[virtual]
    assert 0.7 < float(last.sum()) / float(first.sum()) < 1.4


@pytest.mark.parametrize("copy_info", [False, True])
def test_state_round_trip_samples_the_same(copy_info: bool) -> None:
    _, a = buffers("future", copy_info=copy_info)
    _, b = buffers("future", count=5, copy_info=copy_info)
    state = a.get_state()
    if copy_info:  # what a checkpoint keeps: data, not the dicts
        assert sorted(e["path"] for e in state["infos"]) == [
            ["TimeLimit.truncated"], ["extra", "bonus"], ["offset"], ["weight"]]
    b.set_state({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()})
    sa, sb = (dataclasses.astuple(r.sample(64, torch.Generator().manual_seed(1))) for r in (a, b))
    assert all(torch.equal(x, y) for x, y in zip(sa, sb, strict=True) if x is not None)


def test_nothing_is_sampled_before_an_episode_ends() -> None:
    _, ours = buffers("future", count=0)
    assert len(ours) == 0
    with pytest.raises(ValueError, match="raise learning_starts"):
        ours.sample(4)


def test_the_memory_estimate_counts_every_tensor_it_holds() -> None:
    _, ours = buffers("future", count=0)
    held = [*ours._fields.values(), ours._ends]
    tensor_bytes = sum(t.numel() * t.element_size() for t in held)
    assert ours.nbytes == tensor_bytes + ours.obs.nbytes + ours.next_obs.nbytes
