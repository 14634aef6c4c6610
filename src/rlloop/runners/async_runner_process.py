"""One env runner process of APPO and IMPALA: its loop, and how fragments travel.

The process builds its algorithm, as a Ray runner does, from
:func:`~rlloop.runners.ray_actor.runner_config`, then loops: take the learner's command
(sample, or save, load or restart its state), read the newest weights from shared memory
when they changed, sample a fragment and put it on the queue. The learner's side, which
starts, feeds, restarts and reads these processes, is :mod:`rlloop.runners.async_runners`.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import secrets
import signal
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from rlloop.runners.fragments import Fragment, FragmentSampler
from rlloop.runners.ray_actor import BuildAlgorithm, fragment_steps, runner_config
from rlloop.system.seeding import derive_seed

if TYPE_CHECKING:
    from rlloop.config.run_config import RunConfig

_TENSOR_FIELDS = ("obs", "actions", "rewards", "next_obs", "terminated", "truncated",
                  "last_obs", "log_probs")


def _to_arrays(frag: Fragment) -> Fragment:
    """A fragment whose tensors travel as NumPy arrays: pickled by value, so the learner
    can read it even when the runner that sent it has died since (torch's shared-memory
    tensors need their sender alive)."""
    arrays: dict[str, Any] = {name: getattr(frag, name).numpy()
                              for name in _TENSOR_FIELDS if getattr(frag, name) is not None}
    return dataclasses.replace(frag, **arrays)


def to_tensors(frag: Fragment, device: torch.device) -> Fragment:
    """A fragment as it arrived (NumPy arrays) with its tensors back, on ``device``."""
    tensors: dict[str, Any] = {name: torch.from_numpy(getattr(frag, name)).to(device)
                               for name in _TENSOR_FIELDS if getattr(frag, name) is not None}
    return dataclasses.replace(frag, **tensors)


def _state_command(algorithm: Any, kind: str, arg: Any, index: int, replies: Any) -> None:
    """A runner's answer to the learner's ``get_state``, ``set_state`` or ``restart``."""
    if kind == "get_state":
        replies.put(("state", index, {"generator": algorithm.generator.get_state(),
                                      "runner": algorithm.runner.get_state()}))
    elif kind == "set_state":
        algorithm.generator.set_state(arg["generator"])
        algorithm.runner.set_state(arg["runner"])
        if algorithm.runner.restart_due:
            algorithm.runner.restart_episodes()
    else:  # restart: new episodes and a new sampling stream from the seed ``arg``
        algorithm.generator.manual_seed(derive_seed(arg, "sampling"))
        algorithm.runner.reset(seed=arg)


def serve(config: RunConfig, index: int, life: int, build: BuildAlgorithm,
          weights: dict[str, Tensor], version: Any, fragments: Any, commands: Any,
          replies: Any, ahead: bool) -> None:
    """A runner process's loop (see the module doc). ``life``: how many times this runner
    was started before; a restarted one reseeds its envs and sampling from it."""
    from rlloop.envs.ids import resolve_env_id

    # Ctrl-C reaches the whole process group: the learner decides when runners stop (its
    # first signal stops the run at a boundary, and saves this runner's state).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    parent = os.getppid()
    try:
        # The learner accepted this id (typed by the user, or allowed for a resumed run):
        # import its module here too.
        resolve_env_id(config.env, allow_import=True)
        algorithm = build(runner_config(config, index))
        if life:
            seed = derive_seed(config.seed, f"env-runner-{index}-life-{life}") % 2**31
            algorithm.generator.manual_seed(derive_seed(seed, "sampling"))
            algorithm.runner.reset(seed=seed)
        sampler = FragmentSampler(algorithm, fragment_steps(config))
        instance = secrets.randbits(62)
        mine = -1
        replies.put(("ready", index, None))
        while True:
            try:
                command = commands.get_nowait() if ahead else commands.get(timeout=1.0)
            except queue.Empty:
                if not ahead and os.getppid() != parent:
                    return  # the learner is gone
                command = ("sample", None) if ahead else ("wait", None)
            kind, arg = command
            if kind == "stop":
                return
            if kind in ("get_state", "set_state", "restart"):
                _state_command(algorithm, kind, arg, index, replies)
            elif kind == "sample":
                with version.get_lock():
                    if version.value != mine:
                        algorithm.policy.load_state_dict(weights)
                        mine = int(version.value)
                frag = _to_arrays(sampler.sample(0).tagged(mine, index, instance))
                while True:  # a full queue: wait for the learner, unless it is gone
                    try:
                        fragments.put(frag, timeout=1.0)
                        break
                    except queue.Full:
                        if os.getppid() != parent:
                            return
    except Exception as e:  # the learner restarts this runner, or stops with this line
        replies.put(("error", index, f"{type(e).__name__}: {e}".splitlines()[0][:300]))
        raise SystemExit(1) from None
