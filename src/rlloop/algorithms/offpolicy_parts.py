"""The off-policy family's replaceable parts, selected by name in the config: step
processors, replay buffers, evaluators and recorders.

Each part is a small Protocol with a registry (``STEP_PROCESSORS``, ``REPLAY_BUFFERS``,
``EVALUATORS``, ``RECORDERS``), so a user may register another under a new name; the loop
that composes them is :mod:`rlloop.algorithms.offpolicy_loop`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from rlloop.config.offpolicy import OffPolicyConfig as OffPolicyConfig
from rlloop.config.offpolicy import check_hidden as check_hidden
from rlloop.data.frame_replay import FrameReplayBuffer
from rlloop.data.hindsight_replay import ACHIEVED, DESIRED, HindsightReplayBuffer
from rlloop.data.nstep import NStepProcessor
from rlloop.data.obs_storage import ObsLayout
from rlloop.data.prioritized_replay import PrioritizedReplayBuffer
from rlloop.data.replay import ReplayBuffer, ReplayMemoryError
from rlloop.data.transitions import Transitions
from rlloop.errors import ConfigError, suggest_lower
from rlloop.system.devices import HOST

Stats = dict[str, float]


class StepProcessor(Protocol):
    """Border's StepProcessor: one batched env step in, replay-ready transitions out."""

    def process(self, obs: Tensor, action: Tensor, reward: Tensor, next_obs: Tensor,
                terminated: Tensor, truncated: Tensor) -> Transitions: ...
    def reset(self) -> None: ...
    def get_state(self) -> dict[str, Any]: ...
    def set_state(self, state: dict[str, Any]) -> None: ...


class Replay(Protocol):
    """Border's ReplayBuffer: transitions in, sampled batches out; its state is checkpointed."""

    def __len__(self) -> int: ...
    def add(self, batch: Transitions) -> Tensor: ...
    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> Transitions: ...
    def get_state(self) -> dict[str, Any]: ...
    def set_state(self, state: dict[str, Any]) -> None: ...


class Evaluator(Protocol):
    """Border's Evaluator: scores the current policy; returns at least ``return_mean``."""

    def evaluate(self, algorithm: Any, episodes: int) -> Stats: ...


class Recorder(Protocol):
    """Border's Recorder: collects optimisation stats, hands them over at a record.

    One that holds stats across records' boundaries may also define ``get_state()`` and
    ``set_state(state)``: checkpoints then keep what it holds, so the first record after a
    resume is the one a run trained straight through writes."""

    def add(self, stats: Mapping[str, Tensor | float]) -> None: ...
    def pop(self) -> Stats: ...


@dataclass(frozen=True)
class ExperienceSpec:
    """Shapes the step processor and replay buffer are built for, and their device."""

    num_envs: int
    obs_shape: tuple[int, ...]
    action_shape: tuple[int, ...]
    action_dtype: torch.dtype
    device: torch.device = HOST
    obs_dtype: torch.dtype = torch.float32
    #: Dict observations: replay keeps them per entry (images as uint8).
    obs_layout: ObsLayout | None = None
    #: The env the experience comes from (HER's replay calls its ``compute_reward``).
    env: Any = None


class OneStepProcessor:
    """``NStepProcessor`` with ``n = 1`` and nothing else: each env step is a transition.

    Same output (``final_obs`` of a finished episode as ``next_obs``, ``discount = gamma``),
    without the shape checks and the per-step discount tensor: on one CPU thread that
    overhead is a visible share of an env step at ``N = 1``.
    """

    def __init__(self, num_envs: int, gamma: float, device: torch.device | str = "cpu"
                 ) -> None:
        self._discount = torch.full((num_envs,), gamma, dtype=torch.float32, device=device)

    def process(self, obs: Tensor, action: Tensor, reward: Tensor, next_obs: Tensor,
                terminated: Tensor, truncated: Tensor) -> Transitions:
        return Transitions(obs, action, reward, next_obs, terminated, self._discount)

    def reset(self) -> None:
        pass

    def get_state(self) -> dict[str, Any]:
        return {}

    def set_state(self, state: dict[str, Any]) -> None:
        pass


def _nstep(spec: ExperienceSpec, cfg: OffPolicyConfig) -> StepProcessor:
    if cfg.n_step == 1:
        return OneStepProcessor(spec.num_envs, cfg.gamma, spec.device)
    return NStepProcessor(spec.num_envs, cfg.n_step, cfg.gamma, spec.obs_shape,
                          spec.action_shape, spec.action_dtype, device=spec.device,
                          obs_dtype=spec.obs_dtype)


def _replay(prioritized: bool) -> Callable[[ExperienceSpec, OffPolicyConfig], Replay]:
    def build(spec: ExperienceSpec, cfg: OffPolicyConfig) -> Replay:
        args = (cfg.buffer_size, spec.obs_shape, spec.action_shape, spec.action_dtype,
                spec.device, spec.obs_dtype, spec.obs_layout)
        try:
            if prioritized:
                return PrioritizedReplayBuffer(*args, alpha=cfg.per_alpha, beta=cfg.per_beta)
            return ReplayBuffer(*args)
        except ReplayMemoryError as e:
            raise ConfigError(_replay_too_big(f"{cfg.section}.buffer_size", cfg.buffer_size, e)
                              ) from None
    return build


def _replay_too_big(key: str, value: int, e: ReplayMemoryError) -> str:
    return (f"{key}={value:,} needs {e.needed / 2**30:.2f} GiB of replay memory but only "
            f"{e.available / 2**30:.2f} GiB of {e.where} are left; lower it, "
            f"{suggest_lower(key, e.fits)}")


@dataclass(frozen=True)
class EpisodeEvaluator:
    """Whole episodes on the algorithm's eval env, acting greedily or by sampling."""

    deterministic: bool = True

    def evaluate(self, algorithm: Any, episodes: int) -> Stats:
        return dict(algorithm.evaluate(episodes, None, self.deterministic))


class LastRecorder:
    """A record carries the stats of the optimisation step it is written at (border);
    non-finite ones (of an update the guard skipped) are left out."""

    def __init__(self) -> None:
        self._last: Mapping[str, Tensor | float] = {}

    def add(self, stats: Mapping[str, Tensor | float]) -> None:
        self._last = stats

    def pop(self) -> Stats:
        out = {k: x for k, v in self._last.items() if math.isfinite(x := float(v))}
        self._last = {}
        return out


class MeanRecorder:
    """A record carries the mean of each stat over the optimisation steps since the last,
    over its finite values (an update the guard skipped reports NaN losses).

    Sums and counts stay tensors until the record, so no optimisation step waits on a
    conversion.
    """

    def __init__(self) -> None:
        self._sums: dict[str, Tensor | float] = {}
        self._counts: dict[str, Tensor | int] = {}

    def add(self, stats: Mapping[str, Tensor | float]) -> None:
        for key, value in stats.items():
            count: Tensor | int = 1
            if isinstance(value, Tensor) and value.is_floating_point():
                finite = torch.isfinite(value)
                value, count = torch.where(finite, value, 0.0), finite.long()
            self._sums[key] = self._sums[key] + value if key in self._sums else value
            self._counts[key] = self._counts[key] + count if key in self._counts else count

    def pop(self) -> Stats:
        out = {k: float(v) / n for k, v in self._sums.items()
               if (n := int(self._counts[k])) > 0}
        self._sums, self._counts = {}, {}
        return out

    def get_state(self) -> dict[str, Any]:
        """The sums and counts since the last record, as Python numbers: a float32 sum is
        a float exactly, an integer sum an int."""
        keys = list(self._sums)
        return {"keys": keys, "sums": [_number(self._sums[k]) for k in keys],
                "counts": [int(self._counts[k]) for k in keys]}

    def set_state(self, state: Mapping[str, Any]) -> None:
        keys = list(state["keys"])
        self._sums = dict(zip(keys, state["sums"], strict=True))
        self._counts = dict(zip(keys, (int(n) for n in state["counts"]), strict=True))


def _number(value: Tensor | float) -> float | int:
    """``value`` as a Python int (integer tensors and ints) or float."""
    if isinstance(value, Tensor):
        return value.item() if value.is_floating_point() else int(value)
    return value


def _frame_replay(spec: ExperienceSpec, cfg: OffPolicyConfig) -> Replay:
    s = cfg.section
    if spec.obs_dtype != torch.uint8 or len(spec.obs_shape) < 3:
        raise ConfigError(f"{s}.replay=frames needs stacked uint8 frames (Atari's [4, 84, 84]) "
                          f"but observations are {spec.obs_dtype} {spec.obs_shape}; use "
                          f"{s}.replay=uniform")
    if cfg.n_step != 1:
        raise ConfigError(f"{s}.replay=frames stores one-step transitions; set {s}.n_step=1 "
                          f"or {s}.replay=uniform")
    try:
        return FrameReplayBuffer(cfg.buffer_size, spec.obs_shape, spec.num_envs,
                                 spec.action_shape, spec.action_dtype, spec.device)
    except ReplayMemoryError as e:
        raise ConfigError(_replay_too_big(f"{s}.buffer_size", cfg.buffer_size, e)) from None


def _her_replay(spec: ExperienceSpec, cfg: OffPolicyConfig) -> Replay:
    s, layout = cfg.section, spec.obs_layout
    shapes = {} if layout is None else {name: shape for name, shape, _ in layout.entries}
    if ACHIEVED not in shapes or DESIRED not in shapes:
        what = f"Dict entries {sorted(shapes)}" if shapes else f"{spec.obs_shape} arrays"
        raise ConfigError(f"{s}.replay=her needs goal observations (a Dict with "
                          f"'{ACHIEVED}' and '{DESIRED}' entries) but the env gives {what}; "
                          f"use {s}.replay=uniform")
    if shapes[ACHIEVED] != shapes[DESIRED]:
        raise ConfigError(f"{s}.replay=her needs '{ACHIEVED}' and '{DESIRED}' of one shape, "
                          f"got {shapes[ACHIEVED]} and {shapes[DESIRED]}; fix the env's "
                          "observation space")
    from rlloop.envs.goal_env import goal_reward  # Gymnasium, only for HER
    try:
        return HindsightReplayBuffer(cfg.buffer_size, spec.num_envs, layout,  # type: ignore[arg-type]
                                     spec.action_shape, spec.action_dtype,
                                     goal_reward(spec.env, s, with_infos=cfg.her_copy_info),
                                     cfg.her_n_sampled_goal, cfg.her_strategy, spec.device,
                                     keep_infos=cfg.her_copy_info)
    except ReplayMemoryError as e:
        raise ConfigError(_replay_too_big(f"{s}.buffer_size", cfg.buffer_size, e)) from None


STEP_PROCESSORS: dict[str, Callable[[ExperienceSpec, OffPolicyConfig], StepProcessor]] = {
    "nstep": _nstep,
}


REPLAY_BUFFERS: dict[str, Callable[[ExperienceSpec, OffPolicyConfig], Replay]] = {
    "uniform": _replay(prioritized=False),
    "prioritized": _replay(prioritized=True),
    "frames": _frame_replay,
    "her": _her_replay,
}


EVALUATORS: dict[str, Callable[[], Evaluator]] = {
    "deterministic": lambda: EpisodeEvaluator(deterministic=True),
    "stochastic": lambda: EpisodeEvaluator(deterministic=False),
}


RECORDERS: dict[str, Callable[[], Recorder]] = {"last": LastRecorder, "mean": MeanRecorder}
