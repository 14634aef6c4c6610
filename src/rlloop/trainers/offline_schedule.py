"""The offline cadence: the off-policy schedule with a gradient update per iteration and no
env step.

An offline algorithm (BC, CQL, IQL) learns from a dataset, so an iteration of the
:class:`~rlloop.trainers.loop.Trainer` is one optimisation step (one gradient update on a
sampled batch) followed by the off-policy cadence: an eval every ``eval_interval``, a
record every ``record_interval``, a checkpoint every ``save_interval`` updates, and the end
at ``total_gradient_steps`` (the schedule's ``max_opts``). ``env/steps`` stays 0 (the env only
evaluates) and ``algorithm/collects`` too; ``algorithm/steps`` counts gradient updates.
"""

from __future__ import annotations

from typing import Any, cast

from rlloop.algorithms.offpolicy_parts import EVALUATORS, MeanRecorder
from rlloop.config.offline import OfflineConfig
from rlloop.trainers.loop import Trainer
from rlloop.trainers.offpolicy_schedule import Cadence, OffPolicyAlgorithm, OffPolicySchedule


class OfflineSchedule(OffPolicySchedule):
    """:class:`OffPolicySchedule` whose iteration is one gradient update (see the module
    docstring); evaluations act greedily and records carry the mean since the last."""

    stop_reason = "budget"  # its end is the run's budget, ``total_gradient_steps``

    def __init__(self, algorithm: Any, **kwargs: Any) -> None:
        config: OfflineConfig = algorithm.config
        cadence = Cadence(1, config.eval_interval, config.record_interval,
                          config.save_interval, config.total_gradient_steps)
        super().__init__(cast(OffPolicyAlgorithm, algorithm), cadence=cadence,
                         evaluator=EVALUATORS["deterministic"](), recorder=MeanRecorder(), **kwargs)

    def collect(self, trainer: Trainer, env_config: dict[str, Any] | None) -> int:
        """No env step: every iteration makes one gradient update due."""
        return 1
