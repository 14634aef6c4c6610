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

import time
from typing import Any, cast

from rlloop.algorithms.offpolicy_parts import EVALUATORS, MeanRecorder
from rlloop.config.offline import OfflineConfig
from rlloop.system.signals import atomic
from rlloop.trainers.loop import Stats, Trainer
from rlloop.trainers.offpolicy_schedule import Cadence, OffPolicyAlgorithm, OffPolicySchedule


class OfflineSchedule(OffPolicySchedule):
    """:class:`OffPolicySchedule` whose iteration is one gradient update (see the module
    docstring); evaluations act greedily and records carry the mean since the last."""

    def __init__(self, algorithm: Any, **kwargs: Any) -> None:
        config: OfflineConfig = algorithm.config
        cadence = Cadence(1, config.eval_interval, config.record_interval,
                          config.save_interval, config.total_gradient_steps)
        super().__init__(cast(OffPolicyAlgorithm, algorithm), cadence=cadence,
                         evaluator=EVALUATORS["deterministic"](), recorder=MeanRecorder(), **kwargs)

    def step(self, trainer: Trainer, env_config: dict[str, Any] | None) -> Stats:
        """One gradient update, then its eval, record and save where due."""
        state, clock = trainer.state, time.perf_counter
        t0 = clock()
        paused = self._paused
        stats: Stats = {}
        with atomic():  # made and counted whole, or not at all (its record too)
            opt = self.algorithm.optimize(state["env/steps"])
            state["algorithm/steps"] += 1
            self.recorder.add(opt or {})
            if not self.eval_due(trainer):
                stats.update(self._record_if_due(trainer))
        if self.eval_due(trainer):
            stats.update(self.evaluate(trainer, None))
        else:
            self._save_if_due(trainer)
        trainer.wall_time += clock() - t0 - (self._paused - paused)
        return trainer.count(stats)
