"""A Gymnasium vector env's state for a checkpoint: its random-number generators, and its
physics where every sub-env exposes it.

Gymnasium has no general way to read or write an env's physics; classic-control envs keep
theirs in a numpy ``unwrapped.state`` beside the time limit's step count, and a resumed run
continues their episodes mid-way. Every value is set through ``set_attr``, which reaches
``AsyncVectorEnv``'s worker processes too. The adapter that saves and restores it is
:class:`rlloop.envs.gym.GymVecEnv`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlloop.envs.gym_async import EnvWorkerError
from rlloop.system.signals import StopInterrupted


def vector_env_state(vec: Any) -> dict[str, Any]:
    """The RNG states of ``vec``'s sub-envs and action spaces, and their physics where all
    have it; only ``{"lost": why}`` once async workers failed."""
    failure = getattr(vec, "failure", None)
    if failure is not None:
        return {"lost": failure}
    try:
        state: dict[str, Any] = {
            "env_rngs": [g.bit_generator.state for g in vec.get_attr("np_random")],
            "action_space_rng": vec.action_space.np_random.bit_generator.state,
            "single_action_space_rng": vec.single_action_space.np_random.bit_generator.state,
        }
        physics = _physics(vec)
    except (EnvWorkerError, StopInterrupted):
        # a worker died unseen until asked (a process group's SIGTERM reaches the workers
        # too): the final checkpoint goes on without the envs' state, as after any worker
        # failure
        failure = getattr(vec, "failure", None)
        if failure is None:
            raise
        return {"lost": failure}
    if physics is not None:
        state["physics"] = physics
    return state


def restore_vector_env_state(vec: Any, state: dict[str, Any]) -> bool:
    """Set what :func:`vector_env_state` saved (its ``env_rngs`` one per sub-env of
    ``vec``); whether physics came back too, so that episodes continue."""
    # New Generator objects, set through set_attr, so that this also reaches
    # AsyncVectorEnv's subprocesses (get_attr only returns pickled copies there).
    vec.set_attr("np_random", [_generator_from_state(s) for s in state["env_rngs"]])
    vec.action_space.np_random.bit_generator.state = state["action_space_rng"]
    vec.single_action_space.np_random.bit_generator.state = state["single_action_space_rng"]
    if "physics" not in state:
        return False
    physics = state["physics"]
    vec.set_attr("state", [np.array(x, copy=True) for x in physics["state"]])
    vec.set_attr("_elapsed_steps", [int(n) for n in physics["elapsed_steps"]])
    return True


def _physics(vec: Any) -> dict[str, Any] | None:
    """Sub-envs' ``unwrapped.state`` arrays and time-limit counts, if all have them."""
    # Asked first: a failed attribute read ends an async worker.
    for name in ("state", "_elapsed_steps"):
        if not all(vec.call("has_wrapper_attr", name)):
            return None
    states = vec.get_attr("state")
    steps = vec.get_attr("_elapsed_steps")
    # A tuple of numbers too (MountainCar-v0's state after a step).
    if not all(isinstance(x, np.ndarray | tuple) for x in states) or None in steps:
        return None
    try:
        arrays = [np.array(x, dtype=None if isinstance(x, np.ndarray) else np.float64,
                           copy=True) for x in states]
    except (TypeError, ValueError):
        return None
    return {"state": arrays, "elapsed_steps": [int(n) for n in steps]}


def _generator_from_state(state: dict[str, Any]) -> np.random.Generator:
    bit_generator = getattr(np.random, state["bit_generator"])()
    bit_generator.state = state
    return np.random.Generator(bit_generator)
