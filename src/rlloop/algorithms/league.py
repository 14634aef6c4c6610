"""A self-play league: frozen snapshots of the main module, played as opponents.

Every ``every`` iterations a copy of the main module joins the league as a new, frozen
module (``main_v1``, ``main_v2``, ...). Each episode pits the main module, in alternating
seats, against an opponent drawn uniformly from the league (against itself while the league
is empty). Only the main module is trained; beyond ``size`` snapshots the oldest leaves.
"""

from __future__ import annotations

from typing import Any

import torch

MAIN = "main"


class League:
    """Which snapshots exist and who plays whom; the modules themselves live in the learner."""

    def __init__(self, every: int, size: int) -> None:
        self.every = every
        self.size = size
        self.snapshots: list[str] = []
        self.created = 0

    def due(self, iteration: int) -> bool:
        """A snapshot is taken after iterations ``every``, ``2 * every``, ..."""
        return self.every > 0 and iteration > 0 and iteration % self.every == 0

    def add(self) -> tuple[str, str | None]:
        """Name a new snapshot; returns it and the snapshot it pushes out (if any)."""
        self.created += 1
        new = f"{MAIN}_v{self.created}"
        self.snapshots.append(new)
        gone = self.snapshots.pop(0) if len(self.snapshots) > self.size else None
        return new, gone

    def mapping(self, agents: tuple[str, ...], generator: torch.Generator):  # type: ignore[no-untyped-def]
        """The policy mapping function of a two-player league: ``(agent, episode) -> id``."""

        def policy_for(agent: str, episode: int) -> str:
            if agents.index(agent) == episode % 2:
                return MAIN
            if not self.snapshots:
                return MAIN
            pick = int(torch.randint(len(self.snapshots), (), generator=generator,
                                     device=generator.device))
            return self.snapshots[pick]

        return policy_for

    def get_state(self) -> dict[str, Any]:
        return {"snapshots": list(self.snapshots), "created": self.created}

    def set_state(self, state: dict[str, Any]) -> None:
        self.snapshots = [str(s) for s in state["snapshots"]]
        self.created = int(state["created"])
