"""Pixel observations: encoders by space, uint8 storage, every algorithm on images, Atari."""

from __future__ import annotations

import copy
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from conftest import env_without, rlloop_cmd
from pixel_envs import register, register_box
from stepping import run_steps

from rlloop.config.loading import build_config
from rlloop.data.frame_replay import FrameReplayBuffer
from rlloop.data.returns import gae
from rlloop.envs import env_spec, make_env
from rlloop.errors import ConfigError
from rlloop.modules.encoders import NatureCNN, build_encoder, flat_input, image_layout
from rlloop.runs.build import build_algorithm
from rlloop.runs.memory import estimate
from rlloop.system import devices

register()
register_box()
QUIET = ["mlflow=false", "progress=false", "save_video=false"]
TESTS = Path(__file__).parents[1]


@pytest.mark.parametrize(("shape", "layout"), [
    ((84, 84, 3), (3, 84, 84, True)), ((4, 84, 84), (4, 84, 84, False)),
    ((84, 84), (1, 84, 84, False)), ((3, 64, 48), (3, 64, 48, False)),
])
def test_image_layouts_and_feature_shapes(shape, layout):
    assert image_layout(shape) == layout
    cnn = NatureCNN(shape)
    out = cnn(torch.randint(0, 256, (5, *shape), dtype=torch.uint8))
    assert out.shape == (5, 512) and out.dtype == torch.float32


def test_uint8_frames_are_scaled_inside_the_network():
    torch.manual_seed(0)
    cnn = NatureCNN((4, 84, 84))
    frames = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    torch.testing.assert_close(cnn(frames), cnn(frames.float() / 255))
    # Channels-last frames give what the same frames channels-first give.
    hwc = NatureCNN((84, 84, 4))
    hwc.load_state_dict(cnn.state_dict())
    torch.testing.assert_close(hwc(frames.permute(0, 2, 3, 1)), cnn(frames))


def test_cnn_convolves_channels_last_with_the_channels_first_results():
    # oneDNN's channels-last kernels are 1.4-1.7x faster on the CPU; only the memory layout
    # may differ from the plain channels-first network, not the outputs or gradients.
    torch.manual_seed(0)
    cnn = NatureCNN((4, 84, 84))
    layouts = []
    for layer in cnn.net:
        if isinstance(layer, torch.nn.Conv2d):
            layer.register_forward_pre_hook(lambda _, args: layouts.append(
                args[0].is_contiguous(memory_format=torch.channels_last)))
    frames = torch.randint(0, 256, (6, 4, 84, 84), dtype=torch.uint8)
    out = cnn(frames)
    out.square().sum().backward()
    assert layouts == [True, True, True]
    reference = copy.deepcopy(cnn)
    reference.zero_grad()
    x = frames.float() / 255
    for layer in reference.net:  # module by module: the input stays channels-first
        x = layer(x)
        assert x.is_contiguous()
    x.square().sum().backward()
    torch.testing.assert_close(out, x)
    for mine, theirs in zip(cnn.parameters(), reference.parameters(), strict=True):
        assert mine.is_contiguous()  # weights stay channels-first (fused Adam's state)
        # Each weight gradient sums thousands of products of size ~|grad|.max(): the two
        # layouts' kernels sum them in other orders (which order depends on the CPU's
        # vector width), so an element near zero carries the rounding of terms far larger
        # than itself. The bound scales with the gradient's largest element.
        scale = float(theirs.grad.abs().max())
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-4, atol=1e-5 * scale)


def test_cpu_bfloat16_instructions_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n")  # AVX2-only (AMD EPYC)
    assert devices.cpu_has_bfloat16_units(info) is False
    info.write_text("flags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n")
    assert devices.cpu_has_bfloat16_units(info) is True
    info.write_text("Features\t: fp asimd sve bf16\n")  # Arm
    assert devices.cpu_has_bfloat16_units(info) is True
    info.write_text("processor\t: 0\n")
    assert devices.cpu_has_bfloat16_units(info) is None
    assert devices.cpu_has_bfloat16_units(tmp_path / "missing") is None


def test_a_bfloat16_cnn_warns_once_where_the_cpu_emulates_bfloat16(monkeypatch):
    # Emulated bfloat16 convolutions ran 11x slower than float32 on an AVX2-only CPU.
    frames = torch.zeros((2, 4, 36, 36), dtype=torch.uint8)
    cnn = NatureCNN((4, 36, 36), precision="bfloat16")
    for emulated in (True, False):
        monkeypatch.setattr(devices, "cpu_has_bfloat16_units", lambda e=emulated: not e)
        devices.warn_if_bfloat16_is_emulated.cache_clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cnn(frames)
            cnn(frames)
            NatureCNN((4, 36, 36))(frames)  # float32 never warns
        said = [str(w.message) for w in caught]
        if emulated:
            assert len(said) == 1 and "set <algo>.cnn_precision=float32" in said[0], said
        else:
            assert not said
    devices.warn_if_bfloat16_is_emulated.cache_clear()


def test_bfloat16_cnn_convolves_in_bfloat16_and_trains_float32_weights():
    torch.manual_seed(0)
    ref = NatureCNN((4, 84, 84))
    bf16 = NatureCNN((4, 84, 84), precision="bfloat16")
    bf16.load_state_dict(ref.state_dict())
    dtypes = []
    for layer in bf16.net:
        if isinstance(layer, torch.nn.Conv2d | torch.nn.Linear):
            layer.register_forward_hook(lambda _, args, out: dtypes.append(
                (args[0].dtype, out.dtype)))
    frames = torch.randint(0, 256, (16, 4, 84, 84), dtype=torch.uint8)
    out, expected = bf16(frames), ref(frames)
    assert dtypes == [(torch.bfloat16, torch.bfloat16)] * 4
    assert out.dtype == torch.float32
    # bfloat16 keeps 8 bits of mantissa: features within a few percent of float32's
    assert (out - expected).norm() / expected.norm() < 0.03
    out.square().mean().backward()
    expected.square().mean().backward()
    for mine, theirs in zip(bf16.parameters(), ref.parameters(), strict=True):
        assert mine.dtype == torch.float32 and mine.grad is not None
        assert mine.grad.dtype == torch.float32
        cosine = torch.nn.functional.cosine_similarity(mine.grad.flatten(),
                                                       theirs.grad.flatten(), dim=0)
        assert cosine > 0.99


def test_cnn_precision_is_checked_and_reaches_every_algorithms_encoder():
    with pytest.raises(ConfigError, match=r"dqn.cnn_precision must be one of \['float32', "
                                          r"'bfloat16'\], got 'float16'"):
        build_config("dqn", "CartPole-v1", sets=[*QUIET, "dqn.cnn_precision=float16"])
    for algo, env in (("ppo", "rlloop-test/SidePixels-v0"), ("dqn", "rlloop-test/SidePixels-v0"),
                      ("sac", "rlloop-test/SidePixelsBox-v0"),
                      ("td3", "rlloop-test/SidePixelsBox-v0")):
        small = [] if algo == "ppo" else [f"{algo}.buffer_size=1000"]  # not 1M frames
        algorithm = build_algorithm(build_config(
            algo, env, sets=[*QUIET, "num_envs=2", f"{algo}.cnn_precision=bfloat16", *small]))
        try:
            cnns = [m for m in _all_modules(algorithm) if isinstance(m, NatureCNN)]
            assert cnns and all(c.dtype == torch.bfloat16 for c in cnns), algo
        finally:
            algorithm.close()


def _all_modules(algorithm):
    """Every submodule of the algorithm's networks (policy, Q-network, actor-critic)."""
    for value in vars(algorithm).values():
        if isinstance(value, torch.nn.Module):
            yield from value.modules()


def test_ppo_cnn_values_come_from_the_acting_pass():
    # The rollout records V(s) as it acts; the batch passes only the last observations
    # through the CNN again, unless the rollout did not come from this policy's acting.
    algorithm = build_algorithm(build_config(
        "ppo", "rlloop-test/SidePixels-v0", flags={"num_envs": 2},
        sets=[*QUIET, "ppo.rollout_steps=12", "ppo.minibatch_size=8"]))
    try:
        rows: list[int] = []
        algorithm.policy.encoder.register_forward_pre_hook(
            lambda _, args: rows.append(len(args[0])))
        algorithm.collect()
        assert rows == [2] * 12
        rows.clear()
        fresh = algorithm._batch()
        assert rows == [2]  # the runner's current observations only
        rows.clear()
        again = algorithm._batch()  # used once: a second batch cannot trust them
        assert rows == [24 + 2]
        torch.testing.assert_close(fresh.values, again.values)
        torch.testing.assert_close(fresh.returns, again.returns)
        # A rollout that another policy filled (as Ray runners' fragments do).
        algorithm.runner.collect(lambda obs: (torch.zeros(len(obs), dtype=torch.int64),
                                              torch.zeros(len(obs))), algorithm.buffer)
        rows.clear()
        algorithm._batch()
        assert rows == [24 + 2]
    finally:
        algorithm.close()


def test_encoder_selection_and_override():
    assert isinstance(build_encoder("ppo", "auto", (4, 84, 84), image=True), NatureCNN)
    assert build_encoder("ppo", "auto", (8,), image=False) is None
    assert build_encoder("ppo", "mlp", (4, 84, 84), image=True) is None
    with pytest.raises(ConfigError, match=r"ppo.encoder must be one of \['auto', 'mlp', "):
        build_config("ppo", "CartPole-v1", sets=[*QUIET, "ppo.encoder=resnet"])
    with pytest.raises(ConfigError, match="encoder=mlp"):
        build_encoder("dqn", "nature_cnn", (8,), image=False)


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
@pytest.mark.parametrize(("algo", "env"), [
    ("ppo", "rlloop-test/SidePixels-v0"), ("dqn", "rlloop-test/SidePixels-v0"),
    ("sac", "rlloop-test/SidePixelsBox-v0"), ("td3", "rlloop-test/SidePixelsBox-v0"),
])
def test_every_algorithm_trains_on_uint8_frames(algo, env, precision):
    sets = [*QUIET, "num_envs=2", f"{algo}.cnn_precision={precision}"]
    if algo != "ppo":
        sets += [f"{algo}.learning_starts=8", f"{algo}.batch_size=8", f"{algo}.buffer_size=64"]
    else:
        sets += ["ppo.rollout_steps=8", "ppo.minibatch_size=8", "ppo.num_epochs=1"]
    algorithm = build_algorithm(build_config(algo, env, sets=sets))
    try:
        steps = 0
        for _ in range(12):
            steps += int(algorithm.collect()["env/steps"])
            algorithm.update(steps)
        assert algorithm.runner.obs.dtype == torch.uint8
        store = algorithm.buffer.obs if algo == "ppo" else algorithm.loop.replay._storage["obs"]
        assert store.dtype == torch.uint8 and store.shape[-3:] == (36, 36, 1)
        assert algorithm.act(algorithm.runner.obs).shape[0] == 2
    finally:
        algorithm.close()


def test_ppo_gsde_explores_on_uint8_frames():
    """gSDE drew its noise matrices in the observation's dtype: uint8 frames raised
    'normal_kernel_cpu not implemented for Byte' at the first step."""
    sets = [*QUIET, "num_envs=2", "ppo.use_sde=true", "ppo.rollout_steps=8",
            "ppo.minibatch_size=8", "ppo.num_epochs=1"]
    algorithm = build_algorithm(build_config("ppo", "rlloop-test/SidePixelsBox-v0", sets=sets))
    try:
        run_steps(algorithm, 32)
        assert algorithm._sde_eps is not None and algorithm._sde_eps.dtype == torch.float32
    finally:
        algorithm.close()


@pytest.mark.parametrize(("algo", "env"), [
    ("ppo", "rlloop-test/SidePixels-v0"), ("dqn", "rlloop-test/SidePixels-v0"),
    ("sac", "rlloop-test/SidePixelsBox-v0"), ("td3", "rlloop-test/SidePixelsBox-v0"),
])
def test_encoder_mlp_flattens_uint8_frames_into_floats_scaled_to_one(algo, env):
    """``encoder=mlp`` on uint8 frames (the fix the small-image refusal names) crashed at
    the first forward pass: a uint8 matrix times float weights."""
    sets = [*QUIET, "num_envs=2", f"{algo}.encoder=mlp"]
    sets += ([f"{algo}.learning_starts=8", f"{algo}.batch_size=8", f"{algo}.buffer_size=64"]
             if algo != "ppo" else ["ppo.rollout_steps=8", "ppo.minibatch_size=8"])
    algorithm = build_algorithm(build_config(algo, env, sets=sets))
    try:
        run_steps(algorithm, 40)
        assert algorithm.runner.obs.dtype == torch.uint8
        assert algorithm.act(algorithm.runner.obs).shape[0] == 2
    finally:
        algorithm.close()
    frames = torch.tensor([[[0, 255], [51, 102]]], dtype=torch.uint8)
    torch.testing.assert_close(flat_input(frames), torch.tensor([[0.0, 1.0, 0.2, 0.4]]))
    floats = torch.rand(2, 3, 4)
    assert flat_input(floats).data_ptr() == floats.data_ptr()  # floats pass as they are


def test_recurrent_ppo_reads_frames_through_the_nature_cnn():
    """Recurrent PPO on uint8 frames fed raw bytes to the LSTM (a dtype crash at the first
    step); the README promises the Nature CNN before the cell."""
    algorithm = build_algorithm(build_config("ppo", "rlloop-test/SidePixels-v0", sets=[
        *QUIET, "num_envs=2", "ppo.recurrent=lstm", "ppo.rollout_steps=8",
        "ppo.minibatch_size=8", "ppo.seq_len=4", "ppo.num_epochs=1"]))
    try:
        assert isinstance(algorithm.policy.encoder, NatureCNN)
        assert algorithm.policy.actor_cell.input_size == algorithm.policy.encoder.out_dim
        before = [p.detach().clone() for p in algorithm.policy.encoder.parameters()]
        run_steps(algorithm, 32)
        assert any(not torch.equal(a, b)  # the CNN trains through the cells
                   for a, b in zip(before, algorithm.policy.encoder.parameters(), strict=True))
    finally:
        algorithm.close()


def test_atari_envs_are_preprocessed_as_rl_zoo_does():
    env = make_env("ALE/Breakout-v5", num_envs=2, seed=0)
    try:
        obs = env.reset()
        assert obs.shape == (2, 4, 84, 84) and obs.dtype == torch.uint8
        lost = False
        for _ in range(300):  # random play loses a life within a few hundred steps
            res = env.step(torch.randint(4, (2,)))
            lost |= bool(res.terminated.any())
        assert lost and res.obs.dtype == torch.uint8
    finally:
        env.close()


def _wrappers(vec_env) -> list[str]:  # type: ignore[no-untyped-def]
    from rlloop.envs.gym import find_gym_env

    env, names = find_gym_env(vec_env)._vec.envs[0], []  # type: ignore[union-attr]
    while hasattr(env, "env"):
        names.append(type(env).__name__)
        env = env.env
    return names


def test_atari_evaluation_plays_whole_games():
    """Training ends an episode at every lost life; evaluation (episodic_life: false, as
    the eval envs are made) ends one only when the game is over, as rl-zoo's scores
    count, and restarts each life as training does (FIRE in Breakout)."""
    env = make_env("ALE/Breakout-v5", num_envs=1, seed=0,
                   env_kwargs={"episodic_life": False, "repeat_action_probability": 0.0})
    try:
        env.reset()
        ale = find_gym_env_atari(env).unwrapped.ale
        seen = set()
        for _ in range(5000):
            lives = ale.lives()
            seen.add(lives)
            res = env.step(torch.randint(4, (1,)))
            if bool(res.terminated[0] | res.truncated[0]):
                break
        # One episode: all five lives, ended in the last (the env then began a new game).
        assert bool(res.terminated[0]) and lives == 1 and seen == {1, 2, 3, 4, 5}
    finally:
        env.close()
    algorithm = build_algorithm(build_config("ppo", "ALE/Breakout-v5", flags={"num_envs": 2},
                                             sets=["mlflow=false", "progress=false",
                                                   "ppo.minibatch_size=64"]))
    try:
        assert "EpisodicLife" in _wrappers(algorithm.env)
        assert "FullGames" in _wrappers(algorithm._eval_env({}, 1))
    finally:
        algorithm.close()


def find_gym_env_atari(vec_env):  # type: ignore[no-untyped-def]
    from rlloop.envs.gym import find_gym_env

    return find_gym_env(vec_env)._vec.envs[0]  # type: ignore[union-attr]


def test_an_atari_time_limit_counts_agent_steps():
    """env_kwargs.max_episode_steps counts the agent's steps of a game, as on envpool (it
    went to gymnasium.make, under the 4-frame skip, and counted raw frames: 100 ended
    Pong games after about 20 steps)."""
    env = make_env("ALE/Pong-v5", num_envs=1, seed=0, env_kwargs={"max_episode_steps": 100})
    try:
        env.reset()
        steps, res = 0, None
        while res is None or not bool(res.truncated[0] | res.terminated[0]):
            res = env.step(torch.zeros(1, dtype=torch.long))
            steps += 1
        assert bool(res.truncated[0]) and not bool(res.terminated[0])
        assert 95 <= steps <= 100, steps  # the reset's FIRE presses count too
    finally:
        env.close()


def test_atari_ppo_and_dqn_smoke_with_uint8_storage():
    """About two thousand env steps between them, with the shipped presets' networks and
    preprocessing (smaller rollouts and fewer updates, so that it fits the default run)."""
    ppo = build_algorithm(build_config("ppo", "ALE/Breakout-v5", flags={"num_envs": 2}, sets=[
        *QUIET, "ppo.rollout_steps=128", "ppo.minibatch_size=128", "ppo.num_epochs=1"]))
    try:
        steps = 0
        while steps < 768:
            steps += int(ppo.collect()["env/steps"])
            stats = ppo.update(steps)
        assert ppo.buffer.obs.dtype == torch.uint8 and ppo.buffer.obs.shape == (128, 2, 4, 84, 84)
        # Stored in the layout the CNN takes, and gathered minibatches keep it.
        picked = ppo.buffer.obs.flatten(0, 1)[torch.tensor([5, 0, 3])]
        assert picked.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(picked[1], ppo.buffer.obs[0, 0])
        assert torch.isfinite(torch.tensor(stats["losses/policy"]))
        assert ppo.config.clip_rewards and isinstance(ppo.policy.encoder, NatureCNN)
    finally:
        ppo.close()
    dqn = build_algorithm(build_config("dqn", "ALE/Breakout-v5", sets=[
        *QUIET, "dqn.learning_starts=1000", "dqn.buffer_size=4000", "dqn.opt_interval=32"]))
    try:
        steps = run_steps(dqn, 1200)
        replay = dqn.loop.replay
        assert isinstance(replay, FrameReplayBuffer) and replay.frames.dtype == torch.uint8
        assert len(replay) == steps  # episodes (lives) are long enough: none left early
        # Each 84x84 frame about once, not 8 times (two stacks of 4 per transition).
        assert replay.nbytes < 4000 * (84 * 84 * 1.2 + 64)
        batch = replay.sample(32)
        assert batch.obs.shape == (32, 4, 84, 84) and batch.obs.dtype == torch.uint8
    finally:
        dqn.close()


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(rlloop_cmd(*args), capture_output=True, text=True, timeout=120,
                          cwd=TESTS, env=env)


def test_observation_space_without_an_encoder_exits_2_with_the_fix(tmp_path):
    out = _cli("train", "ppo", "--env", "pixel_envs:rlloop-test/TextObs-v0",
               "--run-dir", str(tmp_path / "run"), "--set", "mlflow=false")
    assert out.returncode == 2, out.stderr
    line, = out.stderr.strip().splitlines()
    assert "observation space Text(" in line and "is not supported" in line
    assert "register a variant wrapped in gymnasium.wrappers.FlattenObservation" in line


def test_atari_without_ale_py_exits_2_naming_the_pip_command(tmp_path):
    env = env_without("ale_py", tmp_path)
    out = _cli("train", "dqn", "--env", "ALE/Pong-v5", "--run-dir", str(tmp_path / "run"),
               env=env)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        "rlloop: error: unknown env id 'ALE/Pong-v5'; it comes from the ale_py package: "
        "pip install ale-py"]
    assert sys.executable


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_ppo_cnn_learns_to_read_the_side_of_a_square_from_pixels(precision):
    # A blind policy scores 5 of 10: only a policy that reads the frames gets near 10.
    algorithm = build_algorithm(build_config(
        "ppo", "rlloop-test/SidePixels-v0", flags={"seed": 0, "num_envs": 8},
        sets=[*QUIET, "ppo.rollout_steps=32", "ppo.minibatch_size=64", "ppo.lr=0.001",
              "ppo.num_epochs=4", f"ppo.cnn_precision={precision}"]))
    try:
        steps, best = 0, 0.0
        while steps < 12_000 and best < 9.5:
            steps += int(algorithm.collect()["env/steps"])
            algorithm.update(steps)
            if steps % 2048 == 0:
                best = max(best, float(algorithm.evaluate(20)["return_mean"]))
        assert best >= 9.5, (steps, best)
    finally:
        algorithm.close()


def test_ppo_cnn_bootstraps_truncated_episodes_from_their_final_frames():
    # Episodes cut at 5 steps (before SidePixels ends them at 10): the CNN path values only
    # the truncated rows' final frames; the targets must equal a pass over all of them.
    algorithm = build_algorithm(build_config(
        "ppo", "rlloop-test/SidePixels-v0", flags={"num_envs": 2},
        sets=[*QUIET, "ppo.rollout_steps=12", "ppo.minibatch_size=8",
              "env_kwargs={max_episode_steps: 5}"]))
    try:
        algorithm.collect()
        buf, policy = algorithm.buffer, algorithm.policy
        assert buf.truncated.sum() >= 2 and not buf.terminated.any()
        batch = algorithm._batch()
        with torch.no_grad():
            values = policy.value(buf.obs.flatten(0, 1)).view(12, 2)
            last = policy.value(algorithm.runner.obs)
            final = policy.value(buf.next_obs.flatten(0, 1)).view(12, 2)
        following = torch.cat([values[1:], last[None]])
        next_values = torch.where(buf.truncated, final, following)
        cfg = algorithm.config
        _, ret = gae(buf.rewards, values, next_values, buf.terminated, buf.truncated,
                     cfg.gamma, cfg.gae_lambda)
        torch.testing.assert_close(batch.returns, ret.flatten())
    finally:
        algorithm.close()


@pytest.mark.parametrize(("replay", "per_transition"), [("frames", 84 * 84 * 9 // 8 + 25),
                                                         ("uniform", 2 * 4 * 84 * 84 + 17)])
def test_memory_check_counts_frames_in_bytes(replay, per_transition):
    # Counted as float32, the Atari DQN preset's 100k-transition replay looked like 22.6 GB
    # and was refused on machines where its 0.8 GB (frames) or 5.6 GB (stacks) fit.
    config = build_config("dqn", "ALE/Breakout-v5", sets=[*QUIET, f"dqn.replay={replay}"])
    spec = env_spec("ALE/Breakout-v5")
    need, = (n for n in estimate(config, spec) if "replay buffer" in n.what)
    assert need.nbytes == 100_000 * per_transition


def test_predict_and_export_take_uint8_frames():
    # A float frame counts as already scaled, so predict must not turn frames into floats.
    from rlloop.api import PPO
    from rlloop.cli.export import example_inputs

    model = PPO("rlloop-test/SidePixels-v0", mlflow=False)
    try:
        actor = model._acting()
        assert example_inputs(actor)[0].dtype == torch.uint8
        with torch.no_grad():  # biases make the network tell 0..255 from 0..1 inputs
            for layer in actor.policy.encoder.net:
                if isinstance(layer, torch.nn.Conv2d):
                    layer.bias.uniform_(-1, 1)
        frames = torch.randint(0, 256, (64, 36, 36, 1), dtype=torch.uint8,
                               generator=torch.Generator().manual_seed(0))
        expected = actor.act(frames).numpy()
        assert (model.predict(frames.numpy()) == expected).all()
    finally:
        model.close()


def test_a_bfloat16_cnn_run_exports_to_onnx_in_float32(tmp_path):
    import onnxruntime

    from rlloop.cli.export import deterministic_policy, export_run, float32_cnns
    from rlloop.runs.saved import load_run_policy
    from rlloop.runs.start import train

    run = train(build_config("ppo", "rlloop-test/SidePixels-v0",
                             flags={"seed": 0, "total_env_steps": 64, "num_envs": 2},
                             sets=[*QUIET, "ppo.rollout_steps=32", "ppo.minibatch_size=32",
                                   "ppo.cnn_precision=bfloat16"]), tmp_path / "run").run_dir
    session = onnxruntime.InferenceSession(str(export_run(run, "onnx")),
                                           providers=["CPUExecutionProvider"])
    frames = torch.randint(0, 256, (32, 36, 36, 1), dtype=torch.uint8,
                           generator=torch.Generator().manual_seed(0))
    (got,) = session.run(["action"], {"obs": frames.numpy()})
    algorithm = load_run_policy(run, device="cpu")
    try:  # the same float32 weights, the CNN computing in float32
        policy = deterministic_policy(algorithm)
        assert float32_cnns(policy) == 1
        with torch.no_grad():
            assert (got == policy(frames).numpy()).all()
    finally:
        algorithm.close()

