"""The task API, for users who bring their own algorithm (K-Scale ``ml``'s RL task).

A task says how to make the env and how the model acts, learns and is scored::

    class MyTask(Task[MyModel]):
        def get_environment(self): return gymnasium.make("CartPole-v1",
                                                         render_mode="rgb_array")
        def get_actions(self, model, states, optimal): ...   # [B, *obs] -> B actions
        def run_model(self, model, batch): ...                # a minibatch -> output
        def compute_loss(self, model, batch, output): ...     # -> loss or {name: loss}

and may post-process what was collected: :meth:`Task.postprocess_trajectory` (one
trajectory, e.g. discounted returns) and :meth:`Task.postprocess_trajectories` (all of an
epoch, e.g. normalising returns). :class:`~rlloop.tasks.trainer.TaskTrainer` drives it:
collect an epoch -> dataset of clips -> minibatch train steps -> checkpoint.
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from rlloop.envs.pool import WorkerPool
from rlloop.errors import ConfigError
from rlloop.learners.optim_step import adam
from rlloop.system.device_names import check_device_name
from rlloop.system.devices import resolve_device, to_device
from rlloop.system.worker_loop import EnvFactory
from rlloop.tasks.dataset import TrajectoryDataset, make_dataloader
from rlloop.tasks.sampling import Sample, SamplingStats, iter_trajectories

ModelT = TypeVar("ModelT", bound=nn.Module)
#: Evaluation and clip episodes are seeded apart from the workers' envs.
EVAL_SEED_OFFSET = 1_000_003


#: TaskConfig's float settings that may also be None.
_OPTIONAL = ("max_wait_time", "step_timeout", "max_grad_norm")


@dataclass
class TaskConfig:
    """Env workers, sampling, dataset and training settings of a task (``ml``'s
    environment, sampling and dataset configs, flattened)."""

    num_env_workers: int = 0
    """Env workers; 0 steps one env on the training thread."""
    env_worker_mode: Literal["sync", "thread", "process"] = "process"
    """Where workers run: on the training thread, in threads or in processes."""
    envs_per_worker: int = 1
    """Envs each worker owns (stepped together, batched together)."""
    env_seed: int = 1337
    """Env j of worker r is seeded env_seed + r * envs_per_worker + j; a TaskTrainer
    reseeds every env at the start of each later epoch from (env_seed, epoch)."""
    step_timeout: float | None = 60.0
    """Seconds a worker may take to answer before it counts as hung (None: no limit)."""
    restart_failed_workers: bool = True
    """Restart a worker whose env raised, died or hung (else stop with WorkerError)."""
    worker_start_method: Literal["forkserver", "spawn"] = "forkserver"
    """How process workers start: forked from a small server process, or as new
    interpreters."""
    num_epoch_samples: int = 2048
    """Samples (env steps in kept trajectories) collected per epoch."""
    min_batch_size: int = 1
    """Fewest states per inference call."""
    max_batch_size: int | None = None
    """Most states per inference call (None: all envs)."""
    max_wait_time: float | None = None
    """Seconds to wait for more states once min_batch_size are ready (None: wait for
    max_batch_size)."""
    min_trajectory_length: int = 1
    """Shorter trajectories are discarded with a warning and not counted."""
    max_trajectory_length: int | None = None
    """Longer episodes are cut here and the env reset (None: no limit)."""
    optimal: bool = False
    """Collect with the optimal (deterministic) action instead of sampling."""
    num_samples: int = 1
    """Consecutive samples per dataset item (clip length)."""
    stride: int = 1
    """Steps between the starts of two clips of one trajectory."""
    batch_size: int = 256
    """Dataset items per minibatch."""
    num_update_steps: int | None = None
    """Train steps per epoch (None: one pass over the epoch's dataset)."""
    total_steps: int = 1_000
    """Train-step budget: training stops after this many steps."""
    lr: float = 1e-3
    """Learning rate of the default optimiser (Adam)."""
    max_grad_norm: float | None = None
    """Clip gradients to this global norm (None: no clipping)."""
    on_nonfinite: Literal["skip", "raise"] = "skip"
    """A NaN/inf in a batch, loss or gradient skips that step (counted in
    guard/skipped_updates) or stops training with an error naming the step."""
    seed: int = 0
    """Seeds torch's, NumPy's and Python's global generators when a TaskTrainer starts a
    new run (the actions sampled while collecting) and each epoch's minibatch order.
    Seed torch yourself before building the model for its initialisation."""
    checkpoint_every: int = 0
    """Train steps between periodic checkpoints (0: only on SIGUSR1 and at the end)."""
    stop_wait_s: float = 10.0
    """Seconds a stop signal (SIGTERM, Ctrl-C) during training waits for the epoch's
    remaining train steps, so that the final checkpoint falls at the epoch's end; past
    them it stops at the next step (a resume then starts the next epoch)."""
    keep_checkpoints: int = 3
    """Periodic checkpoints kept (the newest ones)."""
    max_clip_steps: int = 1_000
    """Longest episode that sample_clip and evaluate run."""
    torch_threads: int = 1
    """torch intra-op threads, set when the trainer starts (1 is fastest for small MLPs
    on CPU; more threads than free cores make tiny ops thousands of times slower)."""
    device: str = "auto"
    """Where the model, its optimiser and the batches live: auto (CUDA when present, else
    CPU), cpu, cuda, cuda:N or mps. The envs run on the host; the states of each
    inference batch and each minibatch cross to the device once."""

    def __post_init__(self) -> None:
        positive = ("envs_per_worker", "num_epoch_samples", "min_batch_size",
                    "min_trajectory_length", "num_samples", "stride", "batch_size",
                    "total_steps", "keep_checkpoints", "max_clip_steps", "torch_threads")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("num_env_workers", "checkpoint_every"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.env_worker_mode not in ("sync", "thread", "process"):
            raise ConfigError(f"env_worker_mode must be sync, thread or process, got "
                              f"{self.env_worker_mode!r}")
        if self.on_nonfinite not in ("skip", "raise"):
            raise ConfigError(f"on_nonfinite must be skip or raise, got {self.on_nonfinite!r}")
        if self.lr <= 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}")
        check_device_name(self.device)
        for name in ("max_batch_size", "max_trajectory_length", "num_update_steps"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be >= 1 or None, got {value}")
        for name, least, strict in (("lr", 0.0, True), ("max_wait_time", 0.0, False),
                                    ("step_timeout", 0.0, True), ("max_grad_norm", 0.0, True),
                                    ("stop_wait_s", 0.0, False)):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and (
                    value > least if strict else value >= least)):
                none = " or None" if name in _OPTIONAL else ""
                raise ConfigError(f"{name} must be a finite number {'>' if strict else '>='} "
                                  f"{least:g}{none}, got {value}")
        self._check_combinations()

    def _check_combinations(self) -> None:
        """Settings that are each fine but cannot hold together (else they would fail
        only once the worker pool runs)."""
        slots = max(self.num_env_workers, 1) * self.envs_per_worker
        pool = (f"the pool's {slots} env{'s' if slots > 1 else ''} (num_env_workers x "
                "envs_per_worker)")
        k = self.envs_per_worker
        if self.max_batch_size is not None and self.max_batch_size < k:
            raise ConfigError(f"max_batch_size={self.max_batch_size} < envs_per_worker={k}: "
                              "a worker's envs always come in one batch; raise it")
        most = min(self.max_batch_size or slots, slots)
        if self.min_batch_size > most:
            limit = (f"max_batch_size={self.max_batch_size}" if self.max_batch_size
                     and self.max_batch_size < slots else pool)
            raise ConfigError(f"min_batch_size={self.min_batch_size} is more than {limit}: "
                              "no inference batch could be that large; lower it")
        if -(-self.min_batch_size // k) > most // k:
            raise ConfigError(f"no multiple of envs_per_worker={k} lies in [min_batch_size="
                              f"{self.min_batch_size}, {most}]: a worker's envs come together")
        shortest, why = ((self.num_samples, "num_samples (each trajectory must hold a clip)")
                         if self.num_samples > self.min_trajectory_length
                         else (self.min_trajectory_length, "min_trajectory_length"))
        if shortest > self.num_epoch_samples:
            raise ConfigError(f"{why}={shortest} > num_epoch_samples={self.num_epoch_samples}: "
                              "no trajectory could be kept; lower it or collect more per epoch")
        if self.max_trajectory_length is not None and self.max_trajectory_length < shortest:
            raise ConfigError(f"max_trajectory_length={self.max_trajectory_length} < {why}="
                              f"{shortest}: every trajectory would be discarded")


@dataclass
class Episode:
    """One in-process episode: its samples, its frames if rendered, the env's render fps."""

    samples: list[Sample]
    frames: list[Any]
    fps: float


class Task(ABC, Generic[ModelT]):
    """Base class of a user task; see the module docstring for what to implement."""

    def __init__(self, config: TaskConfig | None = None) -> None:
        self.config = config if config is not None else TaskConfig()

    @functools.cached_property
    def device(self) -> torch.device:
        """The device ``config.device`` names on this machine (the model's)."""
        return resolve_device(self.config.device)

    # ---- what a task must say --------------------------------------------------------
    @abstractmethod
    def get_environment(self) -> Any:
        """A new Gymnasium-style env. Make it with ``render_mode="rgb_array"`` if you want
        :meth:`sample_clip` to film it."""

    @abstractmethod
    def get_actions(self, model: ModelT, states: Any, optimal: bool) -> Tensor | Sequence[Any]:
        """One action per state for a batch of states (``[B, *obs]``, see
        :meth:`stack_states`); ``optimal`` asks for the deterministic best action."""

    @abstractmethod
    def run_model(self, model: ModelT, batch: Any) -> Any:
        """The model's output on a minibatch (a collated batch of the dataset's items)."""

    @abstractmethod
    def compute_loss(self, model: ModelT, batch: Any,
                     output: Any) -> Tensor | Mapping[str, Tensor]:
        """A scalar loss, or named scalar losses that are summed (and logged one by one)."""

    # ---- optional hooks --------------------------------------------------------------
    def postprocess_trajectory(self, trajectory: list[Sample]) -> list[Any]:
        """Transform one finished trajectory (e.g. attach discounted returns)."""
        return trajectory

    def postprocess_trajectories(self, trajectories: list[list[Any]]) -> list[list[Any]]:
        """Transform all trajectories of an epoch together (e.g. normalise returns)."""
        return trajectories

    def environment_factory(self) -> EnvFactory:
        """What workers call to make their env. Process workers need it picklable: the
        default, ``self.get_environment``, pickles the whole task, and a worker then
        imports the task's module (and torch with it, seconds per worker start). Return a
        ``functools.partial`` of a torch-free function (e.g. of ``gymnasium.make``) so
        that workers import only what the env needs."""
        return self.get_environment

    def stack_states(self, states: list[Any]) -> Any:
        """Observations of one inference batch -> what :meth:`get_actions` receives: one
        tensor on :attr:`device`."""
        return to_device(torch.from_numpy(np.stack(states)), self.device)

    def get_optimizer(self, model: ModelT) -> torch.optim.Optimizer:
        """Adam with the fused kernel where the model's device has one (its step counts
        then live on that device too, never on torch's default device)."""
        return adam(list(model.parameters()), lr=self.config.lr)

    # ---- sampling --------------------------------------------------------------------
    def get_worker_pool(self, force_sync: bool = False) -> WorkerPool:
        """The configured pool (``force_sync``: the same workers, on this thread)."""
        cfg = self.config
        return WorkerPool(self.environment_factory(), cfg.num_env_workers,
                          "sync" if force_sync else cfg.env_worker_mode,
                          envs_per_worker=cfg.envs_per_worker, env_seed=cfg.env_seed,
                          step_timeout=cfg.step_timeout,
                          restart_failed_workers=cfg.restart_failed_workers,
                          start_method=cfg.worker_start_method)

    def act_fn(self, model: ModelT, optimal: bool) -> Callable[[list[Any]], list[Any]]:
        """``get_actions`` as the sampler calls it: no autograd, one action per state."""
        def act(states: list[Any]) -> list[Any]:
            with torch.no_grad():
                actions = self.get_actions(model, self.stack_states(states), optimal)
            if isinstance(actions, Tensor):
                return list(actions.detach().cpu().numpy())
            return list(actions)
        return act

    def iter_samples(
        self,
        model: ModelT,
        worker_pool: WorkerPool,
        *,
        total_samples: int | None = None,
        min_trajectory_length: int = 1,
        max_trajectory_length: int | None = None,
        min_batch_size: int = 1,
        max_batch_size: int | None = None,
        max_wait_time: float | None = None,
        optimal: bool = True,
        stats: SamplingStats | None = None,
        should_stop: Callable[[], bool] | None = None,
        seeds: Sequence[int] | None = None,
    ) -> Iterator[list[Any]]:
        """Post-processed trajectories (rules in :mod:`rlloop.tasks.sampling`). Trajectories
        are at least ``num_samples`` long, so that each yields a clip. ``seeds`` (one per
        env of the pool) reseeds the envs as collection starts.

        Raises:
            ValueError: ``min_trajectory_length > total_samples`` or
                ``min_batch_size > max_batch_size``, before anything runs.
        """
        trajectories = iter_trajectories(
            worker_pool, self.act_fn(model, optimal), total_samples=total_samples,
            min_trajectory_length=max(min_trajectory_length, self.config.num_samples, 1),
            max_trajectory_length=max_trajectory_length, min_batch_size=min_batch_size,
            max_batch_size=max_batch_size, max_wait_time=max_wait_time, stats=stats,
            should_stop=should_stop, seeds=seeds)
        return (self.postprocess_trajectory(t) for t in trajectories)

    def collect_samples(self, model: ModelT, worker_pool: WorkerPool, total_samples: int,
                        **kwargs: Any) -> list[list[Any]]:
        """One epoch of trajectories: :meth:`iter_samples`, then
        :meth:`postprocess_trajectories` over all of them."""
        trajectories = list(self.iter_samples(model, worker_pool, total_samples=total_samples,
                                              **kwargs))
        return self.postprocess_trajectories(trajectories)

    def build_dataset(self, trajectories: list[list[Any]]) -> TrajectoryDataset:
        return TrajectoryDataset(trajectories, self.config.num_samples, self.config.stride)

    def get_dataloader(self, dataset: TrajectoryDataset,
                       generator: torch.Generator | None = None) -> DataLoader[Any]:
        return make_dataloader(dataset, self.config.batch_size, generator=generator)

    # ---- evaluation and clips --------------------------------------------------------
    def run_episode(self, model: ModelT | None, *, optimal: bool = True, render: bool = False,
                    seed: int | None = None) -> Episode:
        """One episode on a fresh in-process env (at most ``max_clip_steps`` steps).

        Without a model, actions are sampled from the env's action space. With
        ``render``, frame ``t`` shows the state that action ``t`` was chosen on.
        """
        env = self.get_environment()
        episode = Episode([], [], float(getattr(env, "metadata", {}).get("render_fps") or 0))
        try:
            obs, _ = env.reset(seed=seed)
            act = self.act_fn(model, optimal) if model is not None else None
            for _ in range(self.config.max_clip_steps):
                if render:
                    episode.frames.append(env.render())
                action = act([obs])[0] if act is not None else env.action_space.sample()
                next_obs, reward, terminated, truncated, _ = env.step(action)
                episode.samples.append(Sample(obs, action, float(reward), next_obs,
                                              bool(terminated), bool(truncated and not terminated)))
                if terminated or truncated:
                    break
                obs = next_obs
            else:  # cut at max_clip_steps: the episode did not end, its last step says so
                if episode.samples:
                    episode.samples[-1].truncated = True
        finally:
            env.close()
        return episode

    def evaluate(self, model: ModelT, episodes: int = 10, optimal: bool = True
                 ) -> dict[str, float]:
        """Mean/min return and mean length over ``episodes`` in-process episodes."""
        returns, lengths = [], []
        for i in range(episodes):
            samples = self.run_episode(model, optimal=optimal,
                                       seed=self.config.env_seed + EVAL_SEED_OFFSET + i).samples
            returns.append(sum(s.reward for s in samples))
            lengths.append(len(samples))
        return {"return_mean": float(np.mean(returns)), "return_min": float(np.min(returns)),
                "return_std": float(np.std(returns)), "length_mean": float(np.mean(lengths)),
                "episodes": float(episodes)}

    def sample_clip(self, model: ModelT | None = None, *, save_path: str | Path | None = None,
                    return_images: bool = True, return_states: bool = False,
                    optimal: bool = True, fps: float | None = None) -> Any:
        """Film one episode (``ml``'s ``sample_clip``).

        With ``save_path`` the frames go to an mp4 there and the result is ``None`` (or
        the states, with ``return_states``). Otherwise returns the frames as a uint8
        tensor ``[T, H, W, C]``, the states (a list of :class:`Sample`), or both.

        Raises:
            ValueError: neither images nor states are asked for.
            rlloop.runs.video.RenderUnavailableError: the env renders no ``rgb_array`` frames.
        """
        from rlloop.runs.video import DEFAULT_FPS, as_frame, offscreen_rendering, write_video

        if not (return_images or return_states or save_path):
            raise ValueError("sample_clip must save a video or return images, states or both")
        offscreen_rendering()
        render = return_images or save_path is not None
        episode = self.run_episode(model, optimal=optimal, render=render,
                                   seed=self.config.env_seed + EVAL_SEED_OFFSET)
        frames = [as_frame(f) for f in episode.frames]
        if save_path is not None:
            write_video(frames, save_path, fps=fps or episode.fps or DEFAULT_FPS)
            return episode.samples if return_states else None
        if not return_images:
            return episode.samples
        images = torch.from_numpy(np.stack(frames))  # frames stay on the host
        return (images, episode.samples) if return_states else images
