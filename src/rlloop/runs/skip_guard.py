"""Stop a run that is not learning: the share of its updates the numerical guard skipped.

A run whose env yields NaN every step skips every update and, unwatched, ends as a success
with nothing learned; this callback warns at the first skip and stops the run, with one
line, once more than ``max_skipped_share`` of its updates were skipped.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from rlloop.config.run_config import SKIPPED_SHARE_RECORDS, RunConfig
from rlloop.learners.learner import Learner
from rlloop.learners.nonfinite import NonFiniteError
from rlloop.trainers.loop import Stats, Trainer

_log = logging.getLogger(__name__)


class SkippedUpdatesGuard:
    """Trainer callback: with ``on_nonfinite=skip``, a warning when updates are first
    skipped for a NaN/inf, and :class:`NonFiniteError` once more than ``max_skipped_share``
    of them were skipped, averaged over ``SKIPPED_SHARE_RECORDS`` records in a row: a run
    whose env yields NaN every step skipped every update and still ended as a success.

    A record is a step whose stats report ``guard/skipped_updates`` (each iteration's;
    border's every record_interval): the counters are read there, so an off-policy update
    still never waits for the device.
    """

    def __init__(self, config: RunConfig, learner: Learner[Any]) -> None:
        self.active = config.on_nonfinite == "skip"  # (raise stops at the first skip)
        self.limit = config.max_skipped_share
        self.learner = learner
        #: The share of its updates each of the latest records skipped.
        self.shares: deque[float] = deque(maxlen=SKIPPED_SHARE_RECORDS)
        self.warned = False
        self.counts = (0, 0)  # tried and skipped updates at the latest record

    def start(self) -> None:
        """Count from the learner's counters as they are now (a resumed run's restored)."""
        self.counts = (self.learner.tried_updates, self.learner.skipped_updates)
        self.shares.clear()

    def on_step(self, trainer: Trainer, stats: Stats) -> None:
        if not self.active or "guard/skipped_updates" not in stats:
            return
        tried, skipped = self.learner.tried_updates, self.learner.skipped_updates
        new_tried, new_skipped = tried - self.counts[0], skipped - self.counts[1]
        self.counts = (tried, skipped)
        if new_tried <= 0:
            return  # no update since the latest record
        self.shares.append(new_skipped / new_tried)
        if new_skipped and not self.warned:
            self.warned = True
            then = ("the run goes on (max_skipped_share=1)" if self.limit >= 1 else
                    f"the run stops if more than {self.limit:.0%} of its updates are skipped "
                    f"over {SKIPPED_SHARE_RECORDS} records in a row (max_skipped_share)")
            _log.warning("updates are being skipped: %d of %d up to env step %s had a "
                         "NaN/inf in the batch, loss or gradient (guard/skipped_updates); "
                         "%s", new_skipped, new_tried,
                         f"{trainer.state['env/steps']:,}", then)
        if len(self.shares) == SKIPPED_SHARE_RECORDS:
            self.judge(trainer)

    def on_eval(self, trainer: Trainer, stats: Stats) -> None:
        pass

    def judge(self, trainer: Trainer) -> None:
        """Raise :class:`NonFiniteError` if the latest records skipped more than the limit
        (the end of a run shorter than the window judges all of its records)."""
        if not self.active or not self.shares:
            return
        share = sum(self.shares) / len(self.shares)
        if share > self.limit:
            raise NonFiniteError(
                f"{share:.0%} of the updates of the last {len(self.shares)} metrics records "
                f"(to env step {trainer.state['env/steps']:,}) were skipped for a NaN/inf in "
                f"the batch, loss or gradient, more than max_skipped_share={self.limit:g}: "
                "the run is not learning. Check the env's observations and rewards (and "
                "env_kwargs) or lower the learning rate, or raise max_skipped_share (1: "
                "never stop)")
