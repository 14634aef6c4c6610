"""Config layering and typed errors for bad input."""

import gymnasium
import numpy as np
import pytest

from rlloop.config.loading import build_config, from_dict, load_yaml
from rlloop.errors import ConfigError
from rlloop.runs.build import build_algorithm


def test_layers_preset_file_flags_sets(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("num_envs: 4\nppo:\n  lr: 0.01\n  rollout_steps: 64\n")
    cfg = build_config("ppo", "CartPole-v1", file=f, flags={"num_envs": 8},
                       sets=["ppo.lr=0.5", "stop_on_solve=false"])
    assert cfg.num_envs == 8 and cfg.hparams.lr == 0.5 and cfg.hparams.rollout_steps == 64
    assert cfg.stop_on_solve is False
    assert cfg.hparams.num_epochs == 4  # from the CartPole preset


def test_roundtrip_through_dict():
    cfg = build_config("ppo", "Pendulum-v1")
    again = from_dict(cfg.to_dict())
    assert again == cfg


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["ppo.lr=abc"], "ppo.lr must be a number"),
        (["ppo.lrr=0.1"], "did you mean ppo.lr"),
        (["bogus=1"], "unknown config key 'bogus'"),
        (["num_envs=0"], "num_envs must be > 0"),
        (["num_envs=2.5"], "num_envs must be an integer"),
        (["stop_on_solve=maybe"], "stop_on_solve must be true or false"),
        (["backend=cuda"], "unknown backend"),
        (["ppo.activation=gelu"], "ppo.activation must be one of"),
        (["ppo.minibatch_size=-1"], "ppo.minibatch_size must be > 0"),
        (["horizons_per_env_reset=0"], "horizons_per_env_reset must be"),
        # (was a ValueError at the start of training, reported as unexpected, exit 1)
        (["horizons_per_env_reset=3"], "eval_every=5 must be a multiple of "
                                       "horizons_per_env_reset=3"),
        (["ppo.hidden=[]"], "ppo.hidden must be a non-empty list"),
        (["noequals"], "--set expects key=value"),
        # Each of these trained (or hung) on before: a negative value weight, a negative
        # value clip, a std that overflows to inf, an optimiser error after start-up,
        # sequences padded to 1,000 steps, an hours-long confirmation, a budget of 1e18.
        (["ppo.vf_coef=-1"], r"ppo.vf_coef must be >= 0"),
        (["ppo.clip_vf=-0.2"], r"ppo.clip_vf must be > 0 \(or null"),
        (["ppo.init_log_std=500"], r"ppo.init_log_std must be in \[-20, 20\]"),
        (["ppo.adam_eps=-1"], r"ppo.adam_eps must be > 0"),
        (["ppo.recurrent=lstm", "ppo.seq_len=1000"],
         r"ppo.seq_len=1000 is longer than ppo.rollout_steps=32 .*; lower ppo.seq_len"),
        (["ppo.recurrent=gru", "ppo.seq_len=24", "ppo.minibatch_size=16"],
         r"ppo.seq_len=24 is longer than ppo.minibatch_size=16"),
        (["solve_episodes=100000000"], r"solve_episodes must be <= 100,000"),
        (["total_env_steps=1e18"], r"total_env_steps must be <= 1e\+15"),
    ],
)
def test_bad_values_raise_config_error(sets, message):
    with pytest.raises(ConfigError, match=message):
        build_config("ppo", "CartPole-v1", sets=sets)


def test_sac_gsde_log_std_is_bounded_and_a_budget_below_learning_starts_is_named():
    from rlloop.config.unused_settings import run_warnings, untrained_budget

    with pytest.raises(ConfigError, match=r"sac.init_log_std must be in \[-20, 20\]"):
        build_config("sac", "Pendulum-v1", sets=["sac.init_log_std=-30"])
    with pytest.raises(ConfigError, match=r"dqn.buffer_size=10 holds fewer transitions than "
                                          r"one batch \(dqn.batch_size=64\)"):
        build_config("dqn", "CartPole-v1", sets=["dqn.buffer_size=10", "dqn.batch_size=64"])
    short = build_config("dqn", "CartPole-v1", sets=["total_env_steps=500"])
    assert short.hparams.learning_starts == 1000  # the preset's
    assert untrained_budget(short) == (
        "dqn.learning_starts=1,000 is not below total_env_steps=500: this run collects only "
        "and never trains; lower dqn.learning_starts or raise total_env_steps")
    assert untrained_budget(build_config("dqn", "CartPole-v1")) is None
    assert untrained_budget(build_config("ppo", "CartPole-v1")) is None
    local = build_config("ppo", "CartPole-v1", sets=["ray.address=garbage"])
    assert run_warnings(local) == [
        "ray.address='garbage' has no effect: this run has no env runners "
        "(num_env_runners=0) and collects in this machine's processes; set num_env_runners "
        "to use the cluster, or drop ray.address"]
    assert run_warnings(build_config("ppo", "CartPole-v1", sets=[
        "ray.address=garbage", "num_env_runners=2"])) == []
    # A preset's iteration much larger than the budget asked for (was silent).
    assert run_warnings(build_config("ppo", "LunarLander-v3", sets=[
        "total_env_steps=2048"])) == [
        "total_env_steps=2,048 rounds up to whole iterations of num_envs x "
        "ppo.rollout_steps = 16,384 env steps: this run trains 16,384; lower num_envs or "
        "ppo.rollout_steps for a shorter run"]
    assert run_warnings(build_config("ppo", "LunarLander-v3")) == []


def test_a_key_given_twice_in_a_config_file_is_refused(tmp_path):
    """PyYAML keeps the last of two equal keys: the run trained at lr 0.5 unannounced."""
    path = tmp_path / "c.yaml"
    path.write_text("ppo: {lr: 1.0e-3, lr: 0.5}\n")
    with pytest.raises(ConfigError, match=r"found the key 'lr' twice in one mapping"):
        build_config("ppo", "CartPole-v1", file=path)
    with pytest.raises(ConfigError, match=r"found the key 'a' twice"):
        build_config("ppo", "CartPole-v1", sets=["env_kwargs={a: 1, a: 2}"])
    # Merge keys still merge (an explicit key overrides the merged one), as YAML has them.
    merged = tmp_path / "m.yaml"
    merged.write_text("base: &b {lr: 0.002, gamma: 0.9}\nppo:\n  <<: *b\n  gamma: 0.95\n"
                      "  rollout_steps: 64\n")
    assert load_yaml(merged)["ppo"] == {"lr": 0.002, "gamma": 0.95, "rollout_steps": 64}
    many = build_config("ppo", "CartPole-v1", sets=["ppo={<<: [{lr: 0.002}, {gamma: 0.9}]}"])
    assert (many.hparams.lr, many.hparams.gamma) == (0.002, 0.9)


def test_unknown_algorithm():
    with pytest.raises(ConfigError, match="unknown algorithm 'trpo'; choose one of"):
        build_config("trpo", "CartPole-v1")


def test_bad_yaml_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("a: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        build_config("ppo", file=f)
    with pytest.raises(ConfigError, match="does not exist"):
        build_config("ppo", file=tmp_path / "missing.yaml")


@pytest.mark.parametrize(("text", "value"), [("4e-3", 0.004), ("4E-3", 0.004), (".004", 0.004),
                                             ("1E5", 1e5), (".5", 0.5), ("2.5e+2", 250.0)])
def test_float_fields_take_every_float_a_python_user_writes(text, value, tmp_path):
    # PyYAML (YAML 1.1) reads 4e-3 and 1E5 as strings; they are numbers to the user.
    f = tmp_path / "c.yaml"
    f.write_text(f"dqn:\n  exploration_initial_eps: 1\n  lr: {text}\nsolve_threshold: {text}\n")
    from_file = build_config("dqn", "CartPole-v1", file=f)
    from_set = build_config("dqn", "CartPole-v1", sets=[f"dqn.lr={text}",
                                                        f"solve_threshold={text}"])
    for cfg in (from_file, from_set):
        assert cfg.hparams.lr == value and cfg.solve_threshold == value
        assert isinstance(cfg.hparams.lr, float)


def test_number_spellings_in_int_fields_and_schedules():
    cfg = build_config("ppo", "CartPole-v1", sets=[
        "total_env_steps=1e5", "ppo.lr_decay_steps=2E5",
        "ppo.clip_coef={type: linear, start: 2e-1, end: 5e-2, steps: 1e5}"])
    assert cfg.total_env_steps == 100_000 and cfg.hparams.lr_decay_steps == 200_000
    from rlloop.config.schedules import make_schedule

    assert make_schedule(cfg.hparams.clip_coef)(50_000) == pytest.approx(0.125)
    with pytest.raises(ConfigError, match="total_env_steps must be an integer"):
        build_config("ppo", "CartPole-v1", sets=["total_env_steps=1.5e0"])


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["ppo.lr=.nan"], "ppo.lr must be a finite number"),
        (["ppo.lr=inf"], "ppo.lr must be a finite number"),
        (["ppo.target_kl=0"], "ppo.target_kl must be > 0"),
        (["seed=-1"], r"seed must be in \[0, 4294967295\]"),
        (["mlflow_interval_s=-0.5"], "mlflow_interval_s must be >= 0"),
        (["env_kwargs.max_episode_steps=0"], "env_kwargs.max_episode_steps must be"),
        (["ppo.clip_coef={type: cosine, start: 0.2, end: 0.1, steps: 0}"],
         "ppo.clip_coef: cosine schedule steps must be an integer > 0"),
        (["ppo.ent_coef={type: piecewise, points: [[0, 0.1], [10, .inf]]}"],
         "ppo.ent_coef: piecewise schedule point_value must be a finite number"),
        # env_kwargs reach the env unchecked: Pendulum's g=.nan made every step NaN.
        (["env_kwargs.g=.nan"], "env_kwargs.g must be a finite number, got nan"),
        (["env.opts={scale: [1.0, .inf]}"],
         r"env_kwargs.opts.scale\[1\] must be a finite number, got inf"),
        # A negative entropy bonus trains the policy to stop exploring.
        (["ppo.ent_coef=-5"], r"ppo.ent_coef must be >= 0 \(a negative weight"),
        (["ppo.ent_coef={type: linear, start: 0.01, end: -0.01, steps: 1000}"],
         "ppo.ent_coef must be >= 0"),
        (["max_skipped_share=1.5"], r"max_skipped_share must be in \[0, 1\]"),
    ],
)
def test_nonsense_values_raise_config_error(sets, message):
    with pytest.raises(ConfigError, match=message):
        build_config("ppo", "CartPole-v1", sets=sets)


def test_config_file_that_is_not_a_yaml_file(tmp_path):
    binary = tmp_path / "c.yaml"
    binary.write_bytes(bytes(range(256)))
    with pytest.raises(ConfigError, match="is not text"):
        build_config("ppo", file=binary)
    with pytest.raises(ConfigError, match="is a directory"):
        build_config("ppo", file=tmp_path)


class _Pixels(gymnasium.Env):  # type: ignore[type-arg]
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self, shape: tuple[int, ...] = (12, 10, 3)) -> None:
        self.observation_space = gymnasium.spaces.Box(0, 255, shape, np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 1.0, False, False, {}


@pytest.mark.parametrize("shape", [(12, 10, 3), (3, 12, 10), (12, 10)])
def test_images_too_small_for_the_cnn_are_refused_with_the_fix(shape):
    env_id = f"rlloop-test/Pixels{len(shape)}{shape[0]}-v0"
    gymnasium.register(env_id, entry_point=_Pixels, kwargs={"shape": shape})
    for algo in ("dqn", "ppo"):
        with pytest.raises(ConfigError, match=r"12x10 are smaller than the Nature CNN's 36x36; "
                                              r"resize them .* or use encoder=mlp"):
            build_algorithm(build_config(algo, env_id, sets=["mlflow=false"]))
        # The override the message names builds the MLP on the flattened pixels.
        built = build_algorithm(build_config(algo, env_id, sets=["mlflow=false",
                                                                 f"{algo}.encoder=mlp"]))
        built.close()


def test_byte_vectors_are_not_images():
    # Atari's RAM observations are 128 uint8 values: a vector an MLP can take.
    gymnasium.register("rlloop-test/Ram-v0", entry_point=_Pixels, kwargs={"shape": (128,)},
                       max_episode_steps=10)
    algo = build_algorithm(build_config("dqn", "rlloop-test/Ram-v0", sets=["mlflow=false"]))
    assert algo.settings.spec.obs_shape == (128,)
    algo.close()
