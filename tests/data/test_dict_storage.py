"""Dict observations beyond PPO: encoders for DQN, SAC and TD3, per-entry storage (image
entries uint8) in replay and rollout buffers, masks from an ``action_mask`` entry, exact
resume, ``predict``/eval, and the refusal of entries no encoder takes."""

from __future__ import annotations

import dataclasses
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import leaves, rlloop_cmd, same_leaf
from dict_envs import N_ACTIONS, DictCue, DictMaskedCue
from stepping import run_iterations

from rlloop.checkpoint import CheckpointManager, load_checkpoint
from rlloop.config.loading import build_config
from rlloop.data.obs_storage import ObsLayout, ObsStore
from rlloop.data.replay import ReplayBuffer
from rlloop.data.transitions import Transitions
from rlloop.envs.core import Discrete, EnvSpec
from rlloop.envs.registry import make_env
from rlloop.errors import EnvError
from rlloop.modules.encoders import DictEncoder
from rlloop.runs.build import build_algorithm
from rlloop.runs.memory import estimate
from rlloop.runs.saved import evaluate_run
from rlloop.runs.start import resume, train

TESTS = Path(__file__).parents[1]
CUE = "rlloop-test/DictCue-v0"
MASKED = "rlloop-test/DictMaskedCue-v0"
REACH = "rlloop-test/DictReach-v0"
QUIET = ["mlflow=false", "progress=false", "save_video=false"]
#: 84x84 frames beside a 3-vector, as in an Atari-sized Dict observation.
BIG = EnvSpec("big", (84 * 84 + 3,), Discrete(4),
              obs_parts=(("frame", (84, 84), True), ("vec", (3,), False)))


def _rows(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    frames = torch.randint(0, 256, (n, 84 * 84), generator=g).float()
    return torch.cat([frames, torch.randn(n, 3, generator=g)], 1)


def _transitions(n: int, seed: int = 0) -> Transitions:
    g = torch.Generator().manual_seed(seed + 1)
    return Transitions(_rows(n, seed), torch.randint(4, (n,), generator=g), torch.randn(n),
                       _rows(n, seed + 2), torch.rand(n, generator=g) < 0.1,
                       torch.full((n,), 0.99))


def test_an_obs_store_keeps_images_uint8_and_reads_back_the_rows():
    layout = ObsLayout.of(BIG)
    assert layout is not None and layout.bytes_per_obs == 84 * 84 + 3 * 4
    store = ObsStore((5, 2), layout)
    assert store.tensors["frame"].dtype == torch.uint8
    assert store.tensors["vec"].dtype == torch.float32
    rows = _rows(10).view(5, 2, -1)
    store[:] = rows
    torch.testing.assert_close(store[:], rows, rtol=0, atol=0)
    torch.testing.assert_close(store[3], rows[3], rtol=0, atol=0)
    assert store.nbytes == 10 * layout.bytes_per_obs


def test_replay_stores_dict_images_as_uint8_and_samples_and_resumes_exactly():
    flat = ReplayBuffer(64, BIG.obs_shape, (), torch.int64)
    keyed = ReplayBuffer(64, BIG.obs_shape, (), torch.int64, obs_layout=ObsLayout.of(BIG))
    rest = 8 + 4 + 1 + 4  # action, reward, terminated, discount
    assert flat.nbytes == 64 * (2 * 4 * (84 * 84 + 3) + rest)
    assert keyed.nbytes == 64 * (2 * (84 * 84 + 3 * 4) + rest)  # 3.96x fewer bytes
    assert {k: v.dtype for k, v in keyed._storage.items() if "frame" in k} == {
        "obs.frame": torch.uint8, "next_obs.frame": torch.uint8}
    batch = _transitions(80)  # wraps around the 64 rows
    flat.add(batch)
    keyed.add(batch)
    a = flat.sample(32, torch.Generator().manual_seed(5))
    b = keyed.sample(32, torch.Generator().manual_seed(5))
    for x, y in zip(dataclasses.astuple(a), dataclasses.astuple(b), strict=True):
        assert (x is None and y is None) or torch.equal(x, y)
    again = ReplayBuffer(64, BIG.obs_shape, (), torch.int64, obs_layout=ObsLayout.of(BIG))
    again.set_state(keyed.get_state())  # per-entry tensors in the checkpoint
    c = again.sample(32, torch.Generator().manual_seed(5))
    fields_b, fields_c = dataclasses.astuple(b)[:6], dataclasses.astuple(c)[:6]
    assert all(torch.equal(x, y) for x, y in zip(fields_b, fields_c, strict=True))


def test_the_memory_check_counts_dict_images_in_bytes():
    config = build_config("dqn", CUE, sets=[*QUIET, "dqn.buffer_size=1000"])
    need, = (n for n in estimate(config, BIG) if "replay buffer" in n.what)
    assert need.nbytes == 1000 * (2 * (84 * 84 + 3 * 4) + 2 * 4 + 8 + 1)


@pytest.mark.parametrize("algo, env", [("ppo", MASKED), ("dqn", MASKED), ("sac", REACH),
                                       ("td3", REACH)])
def test_every_algorithm_encodes_dict_entries_and_stores_images_as_uint8(algo, env):
    a = build_algorithm(build_config(algo, env, flags={"seed": 0, "num_envs": 2},
                                     sets=[*QUIET, *(["ppo.rollout_steps=8",
                                                      "ppo.minibatch_size=16"] if algo == "ppo"
                                                     else [f"{algo}.learning_starts=8"])]))
    try:
        a.collect()
        if algo == "ppo":
            stored = a.buffer.obs.tensors  # type: ignore[attr-defined]
            assert isinstance(a.policy.encoder, DictEncoder)  # type: ignore[attr-defined]
        else:
            stored = {k.removeprefix("obs."): v for k, v in
                      a.loop.replay._storage.items()}  # type: ignore[attr-defined]
        assert stored["pixels"].dtype == torch.uint8
        assert set(stored["pixels"].unique().tolist()) <= set(range(256))
        assert len(stored["pixels"].unique()) > 1  # written, not left at zeros
        if env == MASKED:
            assert stored["action_mask"].dtype == torch.uint8
        assert math.isfinite(a.evaluate(2)["return_mean"])
    finally:
        a.close()


def _target_is_legal(obs: torch.Tensor) -> bool:
    """The rewarded action (``2 * cue + bright``) is legal in every row of ``obs``."""
    target = 2 * obs[:, :3].argmax(1) + (obs[:, 3] > 0).long()
    return bool((obs[:, -N_ACTIONS:] > 0).gather(1, target[:, None]).all())


@pytest.mark.parametrize("backend", ["gymnasium", "gymnasium-async"])
def test_an_action_mask_entry_leaves_the_encoded_entries_and_follows_them(backend):
    env = make_env(MASKED, 3, backend, seed=0)
    ref = DictMaskedCue()
    try:
        assert [k for k, _, _ in env.spec.obs_parts] == ["cue", "pixels"]
        assert env.spec.action_mask == N_ACTIONS and env.spec.obs_shape == (3 + 4 + N_ACTIONS,)
        obs = env.reset(seed=4)
        first, _ = ref.reset(seed=4)
        np.testing.assert_array_equal(obs[0, -N_ACTIONS:].numpy(), first["action_mask"])
        enc = DictEncoder(env.spec.obs_parts, [8], "relu")
        changed = obs.clone()
        changed[:, -N_ACTIONS:] = 1 - changed[:, -N_ACTIONS:]
        assert torch.equal(enc(obs), enc(changed))  # the mask is not encoded
        ends = 0
        for _ in range(12):  # past the 10-step limit: final observations carry their masks
            res = env.step(torch.zeros(3, dtype=torch.int64))
            assert _target_is_legal(res.obs) and _target_is_legal(res.final_obs)
            ends += int(res.truncated.sum())
        assert ends == 3
    finally:
        env.close()


def _train(algo: str, sets: list[str], iterations: int, env: str = MASKED):  # type: ignore[no-untyped-def]
    DictMaskedCue.illegal = DictMaskedCue.steps = 0
    a = build_algorithm(build_config(algo, env, flags={"seed": 0, "num_envs": 4},
                                     sets=[*QUIET, *sets]))
    run_iterations(a, iterations)
    return a


def test_ppo_never_takes_an_action_masked_by_a_dict_entry():
    a = _train("ppo", ["ppo.rollout_steps=32", "ppo.num_epochs=2"], 8)
    try:
        a.evaluate(10)
        a.evaluate(10, deterministic=False)
        assert DictMaskedCue.steps > 1000 and DictMaskedCue.illegal == 0
    finally:
        a.close()


def test_without_masking_the_dict_run_takes_masked_actions():
    _train("ppo", ["ppo.rollout_steps=32", "ppo.num_epochs=2", "ppo.action_mask=false"],
           2).close()
    assert DictMaskedCue.illegal > 50  # so the count above can fail


def test_dqn_never_takes_an_action_masked_by_a_dict_entry_nor_maxes_over_one():
    a = _train("dqn", ["dqn.learning_starts=200", "dqn.exploration_steps=400",
                       "dqn.batch_size=16", "dqn.target_update_interval=10"], 150)
    try:
        a.evaluate(10)
        a.evaluate(10, deterministic=False)
        assert DictMaskedCue.steps > 600 and DictMaskedCue.illegal == 0
        batch = a.loop.replay.sample(64, torch.Generator().manual_seed(0))
        legal = batch.next_obs[:, -N_ACTIONS:] > 0
        assert (~legal).any()  # the replay keeps the next states' masks
        q = a.learner.module()
        with torch.no_grad():
            assert legal.gather(1, q.online(batch.next_obs).argmax(1)[:, None]).all()
            best = torch.where(legal, q.target._q(batch.next_obs), -torch.inf).max(1).values
            expected = batch.reward + batch.discount * best * ~batch.terminated
            torch.testing.assert_close(a.learner.targets(batch), expected)
    finally:
        a.close()


def test_dqn_with_dict_observations_resumes_bit_exactly_and_evaluates(tmp_path):
    # Cut mid-episode, with the replay (per-entry tensors) in the checkpoint.
    def config(steps: int):  # type: ignore[no-untyped-def]
        return build_config("dqn", CUE, flags={"seed": 3, "total_env_steps": steps},
                            sets=[*QUIET, "stop_on_solve=false", "dqn.learning_starts=100",
                                  "dqn.buffer_size=300", "dqn.eval_interval=1000",
                                  "dqn.record_interval=1", "dqn.hidden=[16]"])

    train(config(400), tmp_path / "a")
    train(config(203), tmp_path / "b")
    resume(tmp_path / "b", total_env_steps=400)
    a = load_checkpoint(CheckpointManager(tmp_path / "a" / "checkpoints").latest())
    b = load_checkpoint(CheckpointManager(tmp_path / "b" / "checkpoints").latest())
    la = dict(leaves({k: a.components[k] for k in ("algorithm", "rng")}))
    lb = dict(leaves({k: b.components[k] for k in ("algorithm", "rng")}))
    assert la.keys() == lb.keys()
    pixels = [k for k in la if k.endswith("obs.pixels")]
    assert pixels and all(la[k].dtype == torch.uint8 for k in pixels)
    different = [k for k in la if not (same_leaf(la[k], lb[k]) or (
        "metrics_logger" in k and math.isclose(la[k], lb[k], rel_tol=1e-12)))]
    assert not different, different
    assert evaluate_run(tmp_path / "a", 3)["length_mean"] == 10  # what `rlloop eval` runs


def test_predict_takes_one_dict_observation_or_a_batch():
    from rlloop.api import DQN

    model = DQN(MASKED, mlflow=False)
    ref = DictMaskedCue()
    try:
        obs, _ = ref.reset(seed=1)
        action = model.predict(obs)
        assert action.shape == () and obs["action_mask"][int(action)] == 1
        batch = {k: np.stack([v, v]) for k, v in obs.items()}
        assert model.predict(batch).shape == (2,)
        with pytest.raises(EnvError, match=r"lacks the entries \['pixels'\]"):
            model.predict({"cue": obs["cue"], "action_mask": obs["action_mask"]})
    finally:
        model.close()


def test_a_dict_entry_no_encoder_takes_is_refused_in_one_line(tmp_path, cli_env):
    out = subprocess.run(rlloop_cmd("train", "dqn", "--env",
                                    "dict_envs:rlloop-test/DictOfMultiDiscrete-v0"),
                         env=cli_env, cwd=TESTS, capture_output=True, text=True, timeout=120)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0].startswith("rlloop: error: ") and "'dice': MultiDiscrete" in lines[0]
    assert "is not supported" in lines[0] and "register a variant" in lines[0]


def test_an_action_mask_entry_of_the_wrong_size_is_refused():
    from gymnasium import spaces

    from rlloop.envs.gym_spec import dict_mask_dims

    space = spaces.Dict({**DictCue.observation_space.spaces,
                         "action_mask": spaces.Box(0, 1, (4,), np.int8)})
    with pytest.raises(EnvError, match=r"'action_mask' entry is Box.*6 actions; make it"):
        dict_mask_dims("x", space, spaces.Discrete(N_ACTIONS))
    with pytest.raises(EnvError, match=r"'action_mask' entry needs Discrete actions"):
        dict_mask_dims("x", space, spaces.Box(-1, 1, (2,)))


@pytest.mark.slow
def test_dqn_learns_from_a_vector_and_an_image_entry():
    a = _train("dqn", ["dqn.learning_starts=500", "dqn.exploration_steps=2000",
                       "dqn.buffer_size=10000", "dqn.batch_size=64", "dqn.hidden=[64]",
                       "dqn.target_update_interval=100", "dqn.lr=0.001"],
               1000, env=CUE)
    try:
        learned = a.evaluate(20)["return_mean"]
        assert learned > 8.0, learned  # random: 10/6; the cue alone: 5
    finally:
        a.close()


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_sac_and_td3_learn_from_a_vector_and_an_image_entry(algo):
    a = _train(algo, [f"{algo}.learning_starts=200", f"{algo}.batch_size=64",
                      f"{algo}.hidden=[64,64]", f"{algo}.buffer_size=5000"], 500, env=REACH)
    try:
        learned = a.evaluate(50)["return_mean"]
        assert learned > -0.15, learned  # random: about -0.6; the vector alone: -0.25
    finally:
        a.close()
