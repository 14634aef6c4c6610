"""Bad input that used to fail late: mid-run, at the end of a run, or by the OS killing it."""

from __future__ import annotations

import io
import logging
from collections import namedtuple
from pathlib import Path

import gymnasium
import pytest
import torch
from conftest import FakeClock, plain_console
from rich.console import Console

from rlloop.config.loading import build_config
from rlloop.data.nstep import NStepProcessor
from rlloop.envs.gym import GymVecEnv
from rlloop.envs.gym_spec import gym_env_spec
from rlloop.errors import ConfigError, EnvError
from rlloop.logging import ConsoleSink
from rlloop.logging.console import _fmt_duration
from rlloop.runners.env_runner import EpisodeTracker
from rlloop.runs.memory import check_memory, estimate
from rlloop.runs.preflight import check_action_space


def _plain_sink(total: int | None) -> tuple[ConsoleSink, io.StringIO, FakeClock]:
    console, out = plain_console()
    clock = FakeClock()
    sink = ConsoleSink(total, console=console, print_interval_s=5.0, clock=clock)
    return sink, out, clock


# -- 1. the ETA of a huge budget, and a console that fails at the end --------------------


@pytest.mark.parametrize("seconds", [1e14, 1e18, 1e300, float("inf"), float("nan")])
def test_eta_of_any_size_is_shown_not_raised(seconds: float) -> None:
    assert _fmt_duration(seconds) == ">999 d"


def test_eta_below_the_bound_is_unchanged() -> None:
    assert _fmt_duration(10) == "0:00:10"
    assert _fmt_duration(3 * 86400 + 5) == "3 days, 0:00:05"
    assert _fmt_duration(-1.0) == "0:00:00"


def test_console_with_a_budget_of_1e18_prints_its_lines_and_closes() -> None:
    """`--total-env-steps 1e18`: the ETA's timedelta overflowed; the sink died mid-run,
    then its close (which run.py calls directly) failed the end of the run."""
    sink, out, clock = _plain_sink(10**18)
    sink.log_metrics({"env/steps": 0}, 0)
    clock.t = 10.0
    sink.log_metrics({"env/steps": 1000}, 1000)
    clock.t = 11.0
    sink.log_metrics({"env/steps": 1100}, 1100)  # unprinted: close prints it
    sink.close()
    lines = out.getvalue().splitlines()
    assert lines[1].endswith("| ETA >999 d")
    assert lines[-1].startswith("steps 1,100/1,000,000,000,000,000,000 (0%)")


def test_console_close_never_raises(monkeypatch: pytest.MonkeyPatch,
                                    caplog: pytest.LogCaptureFixture) -> None:
    """A display must never cost the report: run.py calls close() outside the MultiSink."""
    sink, _, clock = _plain_sink(1000)
    sink.log_metrics({"env/steps": 0}, 0)
    clock.t = 1.0
    sink.log_metrics({"env/steps": 10}, 10)

    def broken(width: int | None = None) -> str:
        raise RuntimeError("display broke")

    monkeypatch.setattr(sink, "status_line", broken)
    with caplog.at_level(logging.WARNING, logger="rlloop.logging.console"):
        sink.close()  # no exception
    assert "display broke" in caplog.text


def test_live_console_close_stops_the_bar_even_when_its_update_fails(
        monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    clock = FakeClock()
    console = Console(file=out, width=100, force_terminal=True)
    sink = ConsoleSink(1000, console=console, clock=clock)
    sink.log_metrics({"env/steps": 0}, 0)
    progress = sink._progress
    assert progress is not None and progress.live.is_started

    def broken(width: int | None = None) -> str:
        raise RuntimeError("display broke")

    monkeypatch.setattr(sink, "status_line", broken)
    sink.close()
    assert not progress.live.is_started
    assert sink._progress is None


# -- 2. memory the estimate did not count --------------------------------------------


def _fake_available(monkeypatch: pytest.MonkeyPatch, nbytes: int) -> None:
    memory = namedtuple("memory", "available")
    monkeypatch.setattr("rlloop.runs.memory.psutil.virtual_memory", lambda: memory(nbytes))


def _distinct_tensor_bytes(obj: object) -> int:
    seen: dict[int, int] = {}
    for value in vars(obj).values():
        stack = [value]
        while stack:
            item = stack.pop()
            if isinstance(item, list | tuple):
                stack.extend(item)
            elif isinstance(item, torch.Tensor):
                storage = item.untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_the_estimate_of_num_envs_counts_the_episode_statistics(algo: str) -> None:
    config = build_config(algo, "CartPole-v1", sets=["num_envs=1000"])
    need = next(n for n in estimate(config, check_action_space(config))
                if n.what.startswith("num_envs="))
    assert need.nbytes >= _distinct_tensor_bytes(EpisodeTracker(1000))


def test_ten_million_envs_are_refused_naming_num_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--set num_envs=10000000` passed the check, then the OS killed the run at 21 GB."""
    config = build_config("dqn", "CartPole-v1", sets=["num_envs=10000000"])
    spec = check_action_space(config)
    _fake_available(monkeypatch, 8 * 2**30)
    with pytest.raises(ConfigError, match=r"num_envs=10000000 .*lower num_envs"):
        check_memory(config, spec)


def test_nstep_processor_memory_grows_linearly_with_n() -> None:
    """`dqn.n_step=100000` built n**2 int64 ring orders (about 80 GB)."""
    n = 2000
    proc = NStepProcessor(1, n, 0.99, (4,), (), torch.int64)
    assert _distinct_tensor_bytes(proc) < 200 * n


def test_nstep_window_is_counted_in_the_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    config = build_config("dqn", "CartPole-v1",
                          sets=["num_envs=10000", "dqn.n_step=100000"])
    spec = check_action_space(config)
    _fake_available(monkeypatch, 8 * 2**30)
    with pytest.raises(ConfigError, match=r"dqn\.n_step=100000"):
        check_memory(config, spec)


# -- 3. an env constructor's own checks --------------------------------------------------


class _PickyEnv(gymnasium.Env):  # type: ignore[type-arg]
    def __init__(self, size: int = 1) -> None:
        if size > 10:
            raise ValueError(f"size must be <= 10, got {size}")
        self.observation_space = gymnasium.spaces.Box(-1, 1, (2,))
        self.action_space = gymnasium.spaces.Discrete(2)


gymnasium.register("BadInputLatePicky-v0", entry_point=_PickyEnv)


def test_lunar_lander_gravity_assertion_names_the_setting() -> None:
    pytest.importorskip("Box2D")
    with pytest.raises(EnvError) as info:
        gym_env_spec("LunarLander-v3", {"gravity": 5})
    message = str(info.value)
    assert "LunarLander-v3" in message
    assert "gravity (current value: 5) must be between -12 and 0" in message
    assert "env_kwargs" in message and "--set env.gravity=" in message


@pytest.mark.parametrize("make", [
    lambda: gym_env_spec("BadInputLatePicky-v0", {"size": 11}),
    lambda: GymVecEnv("BadInputLatePicky-v0", 2, env_kwargs={"size": 11}),
])
def test_an_env_constructor_value_error_names_the_setting(make) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(EnvError, match=r"BadInputLatePicky-v0 .*size must be <= 10, got 11"
                                       r".*--set env\.size="):
        make()


def test_a_bug_in_an_env_without_kwargs_is_not_blamed_on_them() -> None:
    class Broken(gymnasium.Env):  # type: ignore[type-arg]
        def __init__(self) -> None:
            raise ValueError("a bug")

    gymnasium.register("BadInputLateBroken-v0", entry_point=Broken)
    with pytest.raises(ValueError, match="a bug") as info:
        gym_env_spec("BadInputLateBroken-v0")
    assert not isinstance(info.value, EnvError)


def test_cli_env_assertion_is_a_typed_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            cli_in_process) -> None:
    pytest.importorskip("Box2D")
    monkeypatch.chdir(tmp_path)
    out = cli_in_process(["train", "ppo", "--env", "LunarLander-v3", "--total-env-steps", "500",
                          "--set", "env.gravity=5", "--set", "save_video=false",
                          "--set", "mlflow=false"])
    assert out.returncode == 2, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("rlloop: error: LunarLander-v3")
    assert "unexpected" not in last and "--set env.gravity=" in last
