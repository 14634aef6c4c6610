"""Videos of a policy: one rendered episode written to an mp4 with imageio/ffmpeg.

Frames are ``[H, W, 3]`` uint8 (``rgb_array`` rendering); frame ``t`` shows the state
that action ``t`` was chosen on, so an episode of ``T`` steps gives ``T`` frames.
"""

from __future__ import annotations

import inspect
import logging
import os
import secrets
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlloop.envs.objects import is_object_env
from rlloop.envs.rendering import offscreen_rendering
from rlloop.errors import RlloopError
from rlloop.system.run_files import pid_alive

_log = logging.getLogger(__name__)
DEFAULT_FPS = 30
TURN_OFF = "turn videos off with --set save_video=false (save_video=False in Python)"


class RenderUnavailableError(RlloopError, RuntimeError):
    """The env cannot produce ``rgb_array`` frames (or the video cannot be written)."""


@dataclass(frozen=True)
class VideoInfo:
    """What :func:`record_run_video` wrote."""

    path: Path
    frames: int
    episode_return: float


def write_video(frames: Iterable[np.ndarray], path: str | Path, fps: float = DEFAULT_FPS) -> int:
    """Encode ``frames`` (each ``[H, W, 3]`` uint8, consumed lazily) as H.264; returns the count.

    Raises:
        RenderUnavailableError: imageio-ffmpeg is missing, or there are no frames.
    """
    try:
        import imageio.v2 as imageio
    except ImportError as e:
        raise RenderUnavailableError("writing videos needs imageio and imageio-ffmpeg; "
                                     "pip install 'rlloop[video]'") from e
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    # macro_block_size=2: H.264 with yuv420p needs even sides; the default (16) would
    # rescale Gymnasium's 600x400 frames. "ultrafast" encodes a 500-frame CartPole episode
    # in ~25% less time than "veryfast" (every run ends waiting for it); the file is ~0.2 MB.
    writer: Any = imageio.get_writer(path, format="FFMPEG", mode="I", fps=fps, codec="libx264",
                                     macro_block_size=2, ffmpeg_log_level="error",
                                     ffmpeg_params=["-preset", "ultrafast"])
    with writer:
        for frame in frames:
            writer.append_data(as_frame(frame))
            count += 1
    if count == 0:
        path.unlink(missing_ok=True)
        raise RenderUnavailableError(f"no frames to write to {path}")
    return count


def as_frame(frame: Any) -> np.ndarray:
    """A rendered frame as contiguous ``[H, W, 3]`` uint8, or a clear error."""
    if frame is None:
        raise RenderUnavailableError("the env rendered None; make it with "
                                     "render_mode='rgb_array'")
    array = np.asarray(frame)
    if array.ndim != 3 or array.shape[-1] not in (3, 4):
        raise RenderUnavailableError(f"expected [H, W, 3] rgb frames, got shape {array.shape}")
    return np.ascontiguousarray(array[..., :3], dtype=np.uint8)


class EpisodeFrames:
    """The frames of env 0's first episode of a ``VecEnv`` with one env, rendered as they are
    iterated: `write_video` pulls each one into ffmpeg's pipe, so encoding overlaps the
    episode and no episode of frames (500 CartPole frames: 360 MB) is ever held.
    ``episode_return`` is the episode's once the frames are consumed."""

    def __init__(self, act: Callable[[torch.Tensor], torch.Tensor], env: Any,
                 render: Callable[[], Any], *, seed: int | None = None,
                 max_steps: int = 10_000) -> None:
        self.act, self.env, self.render = act, env, render
        self.seed, self.max_steps = seed, max_steps
        self.episode_return = 0.0

    def __iter__(self) -> Iterator[np.ndarray]:
        self.episode_return = 0.0
        obs = self.env.reset(seed=self.seed)
        for _ in range(self.max_steps):
            yield as_frame(self.render())
            with torch.inference_mode():
                result = self.env.step(self.act(obs))
            self.episode_return += float(result.reward[0])
            if bool(result.terminated[0] or result.truncated[0]):
                return
            obs = result.obs


def record_vec_episode(act: Callable[[torch.Tensor], torch.Tensor], env: Any,
                       render: Callable[[], Any], *, seed: int | None = None,
                       max_steps: int = 10_000) -> tuple[list[np.ndarray], float]:
    """Frames and return of the first episode of env 0 of a ``VecEnv`` with one env."""
    episode = EpisodeFrames(act, env, render, seed=seed, max_steps=max_steps)
    frames = list(episode)
    return frames, episode.episode_return


def record_run_video(run_dir: str | Path, path: str | Path, *, backend: str | None = None,
                     device: str | None = None, max_steps: int = 10_000,
                     allow_import: bool = False) -> VideoInfo:
    """One deterministic episode of a run's best policy, written to ``path``.

    Raises:
        RenderUnavailableError: the env has no ``render_rgb()`` (native) or cannot be made
            with ``render_mode="rgb_array"`` (Gymnasium).
    """
    from rlloop.algorithms.base import EVAL_SEED_OFFSET
    from rlloop.envs.ids import is_pettingzoo_id
    from rlloop.envs.registry import make_env
    from rlloop.envs.wrappers import NormalizeObservation
    from rlloop.errors import EnvError
    from rlloop.runs.build import build_algorithm
    from rlloop.runs.saved import acting_config, replay_config, restore_policy

    config = replay_config(run_dir, backend, device, allow_import=allow_import)
    if is_pettingzoo_id(config.env):
        raise RenderUnavailableError(f"{config.env} is a multi-agent env and rlloop films "
                                     "single-agent runs only; --set save_video=false skips it")
    if config.backend == "gymnasium-async":  # one env: no subprocesses needed
        config.backend = "gymnasium"
    if config.backend == "envpool":  # it renders no frames; gymnasium's preprocessing is the same
        config.backend = "gymnasium"
    if (reason := unfilmable_reason(config.env)) is not None:
        raise RenderUnavailableError(reason)
    algorithm = build_algorithm(acting_config(config))
    env: Any = None
    try:
        restore_policy(algorithm, Path(run_dir))
        offscreen_rendering()
        try:
            env = make_env(config.env, 1, config.backend, seed=config.seed,
                           env_kwargs={**config.env_kwargs, "render_mode": "rgb_array"},
                           device=algorithm.device)
        except (EnvError, TypeError) as e:
            raise RenderUnavailableError(f"cannot make {config.env} with render_mode="
                                         f"'rgb_array': {e}") from e
        render = getattr(env, "render_rgb", None)
        if render is None:
            raise RenderUnavailableError(f"{config.env} ({config.backend} backend) has no "
                                         "render_rgb(); it cannot be filmed")
        policy_env = (NormalizeObservation(env, algorithm.obs_stats, update=False)
                      if algorithm.obs_stats is not None else env)
        episode = EpisodeFrames(lambda obs: algorithm.act(obs, deterministic=True),
                                policy_env, _render_checked(render, config.env),
                                seed=config.seed + EVAL_SEED_OFFSET, max_steps=max_steps)
        fps = getattr(env, "metadata", {}).get("render_fps") or _native_fps(config.env)
        count = write_video(episode, path, fps=fps)
        return VideoInfo(Path(path), count, episode.episode_return)
    finally:
        if env is not None:
            env.close()
        algorithm.close()


def unfilmable_reason(env_id: str) -> str | None:
    """Why the Gymnasium env ``env_id`` cannot give ``rgb_array`` frames, read from how it
    is registered (its constructor's ``render_mode`` argument, its ``metadata``) before one
    is made: making it anyway costs an env, a Gymnasium warning and a long error. None when
    nothing says so (native envs, other backends' ids: making one finds out)."""
    import gymnasium
    from gymnasium.envs.registration import load_env_creator

    try:
        entry = gymnasium.spec(env_id).entry_point
        creator = load_env_creator(entry) if isinstance(entry, str) else entry
        params = inspect.signature(creator).parameters if callable(creator) else None
    except Exception:  # not a Gymnasium id, or one that making it will explain
        return None
    # The function rlloop registers for an env instance takes any keyword but no render_mode.
    takes_any = not is_object_env(env_id) and any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in (params or {}).values())
    if params is not None and "render_mode" not in params and not takes_any:
        return (f"{env_id} takes no render_mode argument, so it cannot be filmed: give its "
                f"constructor one (render_mode=None), or {TURN_OFF}")
    modes = getattr(creator, "metadata", {}).get("render_modes") \
        if isinstance(getattr(creator, "metadata", None), dict) else None
    if modes is not None and "rgb_array" not in modes:
        return (f"{env_id} lists no 'rgb_array' in metadata['render_modes'] ({list(modes)}), "
                f"so it cannot be filmed: render rgb frames and list it there, or {TURN_OFF}")
    return None


def _render_checked(render: Callable[[], Any], env_id: str) -> Callable[[], Any]:
    """``render``, whose failures (no OpenGL context, no display) become one clear
    :class:`RenderUnavailableError`."""
    def checked() -> Any:
        try:
            return render()
        except RlloopError:
            raise
        except Exception as e:
            hint = ("; MuJoCo envs without a display need MUJOCO_GL=egl (or osmesa) and its "
                    "system library") if _raised_in_mujoco(e) else ""
            raise RenderUnavailableError(
                f"{env_id} could not render a frame ({type(e).__name__}: "
                f"{' '.join(str(e).split())[:200]}){hint}") from e
    return checked


def _raised_in_mujoco(error: BaseException) -> bool:
    """Whether ``error`` came from MuJoCo's renderer (a frame of its traceback is in a
    ``mujoco`` package or Gymnasium's MuJoCo envs)."""
    frames = traceback.extract_tb(error.__traceback__)
    return any("mujoco" in frame.filename.lower() for frame in frames)


def _native_fps(env_id: str) -> float:
    """Real-time playback for the known native envs (CartPole: 0.02 s per step)."""
    return 50.0 if env_id.startswith("CartPole") else DEFAULT_FPS


def drop_leftover_clips(run_dir: Path, name: str) -> None:
    """Remove the half-written clips (``.<name>.<pid>.<hex>.tmp.mp4``) of processes that
    are gone: one killed while filming leaves its file behind."""
    for path in run_dir.glob(f".{name}.*.tmp.mp4"):
        pid = path.name[len(name) + 2:].split(".", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            path.unlink(missing_ok=True)


def save_run_video(run_dir: Path, name: str = "video.mp4") -> Path | None:
    """End-of-run clip of the best policy; a one-line warning instead of an error if the
    env cannot be rendered (a finished run never fails because of its video)."""
    drop_leftover_clips(run_dir, name)
    # Filmed aside and renamed into place: a link at <run>/video.mp4 is replaced, never
    # written through (see rlloop.system.run_files).
    aside = run_dir / f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp.mp4"
    try:
        record_run_video(run_dir, aside)
        os.replace(aside, run_dir / name)
        return run_dir / name
    except Exception as e:
        aside.unlink(missing_ok=True)
        _log.warning("rlloop: video skipped: %s", _skip_reason(e))
        return None


def _skip_reason(error: Exception) -> str:
    """One plain line: why the video was skipped, ending with how to turn videos off."""
    text = " ".join(str(error).split())
    text = text if len(text) <= 240 else text[:237] + "..."
    if not isinstance(error, RenderUnavailableError):
        text = f"{type(error).__name__}: {text}"
    return text if "save_video=false" in text else f"{text}; {TURN_OFF}"
