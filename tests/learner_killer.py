"""A ``--callback`` for the learner-fault tests: SIGKILLs learner rank 1 once."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil

from rlloop.trainers.callbacks import Callback


class KillLearnerRank(Callback):
    """After iteration 3, SIGKILL the spawned learner rank, once per marker file (the
    restarted learner group of the same run is left alone)."""

    def on_step(self, stats):  # type: ignore[no-untyped-def]
        marker = Path(os.environ["RLLOOP_TEST_KILL_MARKER"])
        if stats["algorithm/steps"] < 3 or marker.exists():
            return None
        ranks = [p for p in psutil.Process().children()
                 if "spawn_main" in " ".join(p.cmdline())]
        assert len(ranks) == 1, ranks
        marker.write_text(str(ranks[0].pid))
        os.kill(ranks[0].pid, signal.SIGKILL)
        return None
