"""Batched environments: the ``VecEnv`` interface, native torch envs, Gymnasium adapter."""

from rlloop.envs.core import Box, Discrete, EnvError, EnvSpec, StepResult, VecEnv
from rlloop.envs.gym import GymVecEnv
from rlloop.envs.native.cartpole import CartPoleVecEnv
from rlloop.envs.registry import NATIVE_ENVS, env_spec, make_env, register_native

__all__ = [
    "NATIVE_ENVS",
    "Box",
    "CartPoleVecEnv",
    "Discrete",
    "EnvError",
    "EnvSpec",
    "GymVecEnv",
    "StepResult",
    "VecEnv",
    "env_spec",
    "make_env",
    "register_native",
]
