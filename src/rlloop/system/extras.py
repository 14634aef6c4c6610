"""Optional dependencies: which ``rlloop[...]`` extra installs each, found without importing it.

A feature whose package is missing is refused in one line naming the extra, before the
command writes anything or imports torch (``find_spec`` locates a package without running
it, so checking costs milliseconds even for Ray or W&B).
"""

from __future__ import annotations

import importlib.util

from rlloop.errors import ConfigError

#: Importable name -> (what the user calls it, the extra that installs it).
EXTRAS: dict[str, tuple[str, str]] = {
    "optuna": ("Optuna", "tune"),
    "wandb": ("wandb", "wandb"),
    "tensorboard": ("TensorBoard", "tensorboard"),
    "ray": ("Ray", "ray"),
    "envpool": ("envpool", "envpool"),
    "mujoco": ("MuJoCo", "mujoco"),
    "ale_py": ("ale-py", "atari"),
    "minigrid": ("MiniGrid", "minigrid"),
    "pettingzoo": ("PettingZoo", "multiagent"),
    "Box2D": ("Box2D", "box2d"),
    "onnx": ("ONNX", "export"),
    "imageio": ("imageio", "video"),
    "minari": ("Minari", "offline"),
}


def install_command(module: str) -> str:
    """``pip install 'rlloop[extra]'`` for the extra that installs ``module``."""
    return f"pip install 'rlloop[{EXTRAS[module][1]}]'"


def installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder that refuses it; a module set to None
        return False


def require(module: str, feature: str, instead: str | None = None) -> None:
    """``ConfigError`` naming the extra unless ``module`` is installed; ``feature`` is
    what needs it as the user asked for it (``rlloop tune``, ``wandb=true``), ``instead``
    what the user may do without it."""
    if not installed(module):
        name = EXTRAS[module][0]
        other = f" (or {instead})" if instead else ""
        raise ConfigError(f"{feature} needs {name}, which is not installed: "
                          f"{install_command(module)}{other}")
