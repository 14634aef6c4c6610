"""``rlloop export``: a run's deterministic policy as ONNX or TorchScript.

The exported graph is the path evaluation takes: the observation normaliser, then the
algorithm's own ``act(obs, deterministic=True)`` (argmax for discrete actions, the mean or
``tanh(mean)`` rescaled to the action box for continuous ones), traced once. Input
``obs`` ``[B, *obs_shape]`` float32; output ``action`` ``[B]`` int64 or ``[B, *act_shape]``
float32, numbered as the env numbers its actions (a Gymnasium space's ``start`` added).

A run trained with ``<algo>.cnn_precision=bfloat16`` exports its CNN computing in
float32 for ONNX (the same float32 weights; ONNX runtimes have no bfloat16 convolutions),
and in bfloat16, as it trained and evaluates, for TorchScript.

A recurrent PPO policy carries its memory through the graph instead: inputs ``obs`` and
``state`` ``[B, S]`` (zeros at an episode's first step), outputs ``action`` and
``next_state``, which the caller feeds back with the next observation.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

from rlloop.algorithms import AlgorithmBase
from rlloop.envs.gym import find_gym_env
from rlloop.envs.normalizer import RunningMeanStd
from rlloop.errors import ConfigError, RunDirError
from rlloop.modules.recurrent import RecurrentActorCritic
from rlloop.runs.disk_full import DISK_FULL_ERRNOS, output_disk_full
from rlloop.system.run_files import check_output_file, check_run_dir, write_file

FORMATS = {"onnx": "policy.onnx", "torchscript": "policy.pt"}
#: Algorithms whose ``act`` maps one observation batch to one action batch.
EXPORTABLE = ("ppo", "a2c", "dqn", "qrdqn", "sac", "td3", "tqc", "crossq", "bc", "cql", "iql")


class ObsNormalizer(nn.Module):
    """:meth:`RunningMeanStd.normalize` with the statistics frozen as float32 buffers."""

    mean: Tensor
    var: Tensor

    def __init__(self, stats: RunningMeanStd) -> None:
        super().__init__()
        self.register_buffer("mean", stats.mean.to(torch.float32).cpu())
        self.register_buffer("var", stats.var.to(torch.float32).cpu())
        self.eps, self.clip = stats.eps, stats.clip

    def forward(self, obs: Tensor) -> Tensor:
        z = (obs - self.mean) / torch.sqrt(self.var + self.eps)
        return z.clamp(-self.clip, self.clip)


class DeterministicPolicy(nn.Module):
    """observation -> normalised observation -> deterministic action of ``algorithm``."""

    #: The exported graph's input and output names, in ``forward``'s order.
    input_names: tuple[str, ...] = ("obs",)
    output_names: tuple[str, ...] = ("action",)

    def __init__(self, algorithm: AlgorithmBase) -> None:
        super().__init__()
        if algorithm.name not in EXPORTABLE:
            raise ConfigError(f"rlloop export supports {', '.join(EXPORTABLE)} runs, not "
                              f"{algorithm.name}")
        stats = algorithm.obs_stats
        self.normalizer: nn.Module = ObsNormalizer(stats) if stats else nn.Identity()
        # Registered so the weights are the graph's parameters, not anonymous constants.
        self.networks = nn.ModuleList(m for m in vars(algorithm).values()
                                      if isinstance(m, nn.Module))
        self._act: Callable[..., Tensor] = algorithm.act
        # A Gymnasium action space counting from `start`: the env's own action numbers.
        gym = find_gym_env(algorithm.env)
        offset = gym.action_offset() if gym is not None else None
        self.offset: Tensor | None = None if offset is None else torch.as_tensor(offset)

    def _env_actions(self, actions: Tensor) -> Tensor:
        return actions if self.offset is None else actions + self.offset

    def forward(self, obs: Tensor) -> Tensor:
        return self._env_actions(self._act(self.normalizer(obs), True))


class RecurrentDeterministicPolicy(DeterministicPolicy):
    """(observation, state) -> (deterministic action, next state) of a recurrent policy:
    one step of its cells, then the heads' mode."""

    input_names = ("obs", "state")
    output_names = ("action", "next_state")

    def __init__(self, algorithm: AlgorithmBase) -> None:
        super().__init__(algorithm)
        self.policy: RecurrentActorCritic = algorithm.policy  # type: ignore[attr-defined]

    def forward(self, obs: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        features, next_state = self.policy.step(self.normalizer(obs), state)
        return self._env_actions(self.policy.act(features, deterministic=True)[0]), next_state


def is_recurrent(algorithm: AlgorithmBase) -> bool:
    return isinstance(getattr(algorithm, "policy", None), RecurrentActorCritic)


def deterministic_policy(algorithm: AlgorithmBase) -> DeterministicPolicy:
    """The exportable policy of ``algorithm``: with a state input when it is recurrent."""
    if is_recurrent(algorithm):
        return RecurrentDeterministicPolicy(algorithm)
    return DeterministicPolicy(algorithm)


def example_inputs(algorithm: AlgorithmBase, batch: int = 4) -> tuple[Tensor, ...]:
    """Inputs to trace the policy with: observations (and a zero state if recurrent)."""
    spec = algorithm.settings.spec
    # Pixel policies take uint8 frames and scale them inside: export them that way.
    obs = torch.zeros(batch, *spec.obs_shape, dtype=spec.obs_dtype)
    if is_recurrent(algorithm):
        return obs, algorithm.policy.initial_state(batch, obs.device)  # type: ignore[attr-defined]
    return (obs,)


def export_bytes(policy: DeterministicPolicy, example: tuple[Tensor, ...], fmt: str) -> bytes:
    buf = io.BytesIO()
    # A trace keeps no no_grad context: without this a loaded policy's actions carry grad.
    policy.eval().requires_grad_(False)
    with torch.no_grad(), warnings.catch_warnings():
        # TorchScript and the ONNX exporter built on it are deprecated in torch 2.9+ but
        # still the formats other tools load; the dynamo exporter needs onnxscript too.
        warnings.simplefilter("ignore", DeprecationWarning)
        if fmt == "torchscript":
            torch.jit.save(torch.jit.trace(policy, example), buf)
        else:
            names = (*policy.input_names, *policy.output_names)
            torch.onnx.export(policy, example, buf,  # type: ignore[arg-type]
                              dynamo=False, input_names=list(policy.input_names),
                              output_names=list(policy.output_names),
                              dynamic_axes={n: {0: "batch"} for n in names})
    return buf.getvalue()


def float32_cnns(module: nn.Module) -> int:
    """Have every bfloat16 Nature CNN in ``module`` compute in float32; how many did not."""
    from rlloop.modules.encoders import NatureCNN

    cnns = [m for m in module.modules()
            if isinstance(m, NatureCNN) and m.dtype != torch.float32]
    for cnn in cnns:
        cnn.dtype = torch.float32
    return len(cnns)


def export_run(run_dir: str | Path, fmt: str, out: str | Path | None = None, *,
               allow_import: bool = False, notify: Callable[[str], None] | None = None
               ) -> Path:
    """Write the deterministic policy of ``run_dir``'s best checkpoint as ``fmt`` (onnx or
    torchscript) to ``out`` (default ``<run>/policy.onnx`` or ``<run>/policy.pt``).

    ``notify`` gets one line if a damaged ``best/`` (NaN weights too) is passed over for
    the newest intact checkpoint (see ``rlloop.runs.saved.restore_policy``)."""
    from rlloop.runs.saved import load_run_policy

    if fmt not in FORMATS:
        raise ConfigError(f"unknown export format {fmt!r}; choose one of {sorted(FORMATS)}")
    if fmt == "onnx":
        try:
            import onnx  # noqa: F401  (torch.onnx.export needs it)
        except ImportError:
            raise ConfigError("--format onnx needs the onnx package; install it with "
                              "`pip install 'rlloop[export]'`") from None
    run = check_run_dir(run_dir)
    path = Path(out) if out else run / FORMATS[fmt]
    check_output_file(path, [run], allowed=[FORMATS[fmt]])
    algorithm = load_run_policy(run_dir, device="cpu", allow_import=allow_import,
                                notify=notify)
    try:
        policy = deterministic_policy(algorithm)
        if fmt == "onnx":
            float32_cnns(policy)
        data = export_bytes(policy, example_inputs(algorithm), fmt)
    finally:
        algorithm.close()
    try:
        write_file(path, data)
    except OSError as e:  # the checks above cannot foresee /proc, a read-only mount, quota
        if e.errno in DISK_FULL_ERRNOS:
            raise output_disk_full(path, len(data)) from None
        raise RunDirError(f"-o {path} cannot be written ({e.strerror or e}); write the "
                          "export to a directory that takes files") from None
    return path
