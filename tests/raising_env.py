"""A CartPole whose ``step()`` raises after a number of steps: an env with a bug in it.

Importing this module registers it, so ``--env raising_env:RaisingCartPole-v0`` reaches it
through Gymnasium's ``module:Env-v0`` ids (with this folder on ``PYTHONPATH``).
"""

from __future__ import annotations

from typing import Any

import gymnasium

ENV_ID = "RaisingCartPole-v0"


class RaiseInStep(gymnasium.Wrapper):
    """Steps normally ``after`` times, then every ``step()`` raises RuntimeError."""

    def __init__(self, env: gymnasium.Env, after: int) -> None:
        super().__init__(env)
        self.after = after
        self.steps = 0

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.steps > self.after:
            raise RuntimeError(f"simulated bug at step {self.steps}")
        return self.env.step(action)


def make(after: int = 100, **kwargs: Any) -> gymnasium.Env:
    return RaiseInStep(gymnasium.make("CartPole-v1", **kwargs), after)


if ENV_ID not in gymnasium.registry:
    gymnasium.register(ENV_ID, entry_point=make, disable_env_checker=True)
