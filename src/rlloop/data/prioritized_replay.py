"""The prioritized replay buffer: transitions sampled in proportion to their priority, with
importance weights that undo the bias.

Priorities live in sum and min trees in host memory (numpy: a tree walk is many tiny
gathers, where torch's dispatch costs more than the work); a checkpoint keeps the trees'
leaves, so a restored buffer samples what the saved one would. The uniform buffer it
extends is :mod:`rlloop.data.replay`.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from rlloop.data.obs_storage import ObsLayout
from rlloop.data.replay import ReplayBuffer
from rlloop.data.transitions import Transitions
from rlloop.system.devices import stats_dtype


def _host_uniform(size: int, generator: torch.Generator | None) -> np.ndarray:
    """``size`` uniform [0, 1) float64 draws from ``generator`` (on its device; float32
    on MPS, which has no float64), on the host."""
    device = generator.device if generator is not None else torch.device("cpu")
    draw = torch.rand(size, generator=generator, dtype=stats_dtype(device), device=device)
    return draw.cpu().double().numpy()


class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay (Schaul et al. 2016, arXiv:1511.05952).

    Row ``i`` is sampled with probability ``P(i) = p_i^alpha / sum_j p_j^alpha`` where
    ``p_i = |td_error_i| + eps``; new rows get the largest ``p`` seen so far. A sum
    tree gives ``O(log capacity)`` sampling and updates, a min tree the largest
    importance weight. Both are flat float64 arrays (root at 1, leaves at ``[L, 2L)``
    with ``L`` the next power of two >= ``capacity``), and every operation walks the
    levels once for the whole batch.

    The trees are numpy arrays in host memory whatever ``device`` is: a tree walk is
    ~100 tiny gathers and scatters, where numpy's ~1 us per call beats torch's
    dispatch overhead by about 10x on CPU (2^20 leaves, batch 256).

    Args:
        capacity, obs_shape, action_shape, action_dtype, device, obs_dtype, obs_layout:
            As ``ReplayBuffer``.
        alpha: Prioritisation exponent; 0 is uniform.
        beta: Default importance-sampling exponent for ``sample``; the caller anneals
            it towards 1 by passing ``beta`` there.
        eps: Added to ``|td_error|`` so no row has zero probability.
    """

    def __init__(
        self,
        capacity: int,
        obs_shape: tuple[int, ...],
        action_shape: tuple[int, ...],
        action_dtype: torch.dtype,
        device: torch.device | str = "cpu",
        obs_dtype: torch.dtype = torch.float32,
        obs_layout: ObsLayout | None = None,
        *,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
    ) -> None:
        if alpha < 0 or eps <= 0:
            raise ValueError(f"need alpha >= 0 and eps > 0, got alpha={alpha}, eps={eps}")
        _check_beta(beta)
        self.alpha, self.beta, self.eps = alpha, beta, eps
        self._leaves = 1 << max(0, capacity - 1).bit_length()
        self._depth = self._leaves.bit_length() - 1
        super().__init__(capacity, obs_shape, action_shape, action_dtype, device, obs_dtype,
                         obs_layout)
        self._sum_tree = np.zeros(2 * self._leaves, dtype=np.float64)
        self._min_tree = np.full(2 * self._leaves, np.inf, dtype=np.float64)
        self._max_priority = 1.0

    def _required_nbytes(self) -> int:
        return super()._required_nbytes() + 2 * (2 * self._leaves) * 8

    def add(self, batch: Transitions) -> Tensor:
        """As ``ReplayBuffer.add``; the new rows get the current max priority."""
        rows = super().add(batch)
        self._set_leaves(rows.cpu().numpy(), np.full(rows.shape[0], self._max_priority**self.alpha))
        return rows

    def sample(
        self,
        batch_size: int,
        generator: torch.Generator | None = None,
        beta: float | None = None,
    ) -> Transitions:
        """Stratified proportional sample: one draw from each of ``batch_size`` equal
        slices of the total priority mass.

        Returns:
            ``Transitions`` of ``[batch_size, ...]`` with ``indices`` and float32
            ``weights = (N P(i))^-beta / max_j (N P(j))^-beta`` (max over the buffer).
        """
        self._check_can_sample(batch_size)
        beta = self.beta if beta is None else _check_beta(beta)
        uniform = _host_uniform(batch_size, generator)
        mass = (np.arange(batch_size) + uniform) * (self._sum_tree[1] / batch_size)
        rows = self._retrieve(mass)
        # (N P(i))^-beta / max_j (N P(j))^-beta == (p_i / p_min)^-beta
        weights = (self._sum_tree[rows + self._leaves] / self._min_tree[1]) ** -beta
        return self._gather(
            torch.from_numpy(rows).to(self.device),
            torch.from_numpy(weights).to(self.device, torch.float32),
        )

    def update_priorities(self, indices: Tensor, td_errors: Tensor) -> None:
        """Set ``p = |td_error| + eps`` for rows ``indices`` (both ``[B]``).

        A row listed twice (sampling is with replacement) keeps its largest priority.
        """
        idx = indices.detach().cpu().numpy().astype(np.int64, copy=False)
        if idx.size and (idx.min() < 0 or idx.max() >= self._size):
            raise ValueError(f"priority indices must be rows in [0, {self._size})")
        priority = np.abs(td_errors.detach().to("cpu", torch.float64).numpy()) + self.eps
        rows, inverse = np.unique(idx, return_inverse=True)
        best = np.zeros(rows.shape[0], dtype=np.float64)
        np.maximum.at(best, inverse.reshape(-1), priority)
        if best.size:
            self._max_priority = max(self._max_priority, float(best.max()))
        self._set_leaves(rows, best**self.alpha)

    def get_state(self) -> dict[str, Tensor | int | float]:
        """``ReplayBuffer.get_state`` plus ``priorities`` (``p^alpha``, ``[len]`` float64
        view of the tree), ``max_priority`` and ``alpha``."""
        state = super().get_state()
        leaves = self._sum_tree[self._leaves : self._leaves + self._size]
        state.update(
            priorities=torch.from_numpy(leaves), max_priority=self._max_priority, alpha=self.alpha
        )
        return state

    def set_state(self, state: dict[str, Tensor | int | float]) -> None:
        if float(state["alpha"]) != self.alpha:
            raise ValueError(
                f"replay state was saved with alpha={state['alpha']} but this buffer has "
                f"alpha={self.alpha}; build the buffer with the saved alpha"
            )
        super().set_state(state)
        priorities = state["priorities"]
        if not isinstance(priorities, Tensor) or priorities.shape != (self._size,):
            raise ValueError(f"replay state 'priorities' must be a tensor of shape {(self._size,)}")
        leaves = priorities.detach().to("cpu", torch.float64).numpy()
        self._sum_tree[self._leaves :] = 0.0
        self._min_tree[self._leaves :] = np.inf
        self._sum_tree[self._leaves : self._leaves + self._size] = leaves
        self._min_tree[self._leaves : self._leaves + self._size] = leaves
        # Rebuild bottom-up with the same additions the incremental updates make, so the
        # restored tree is bit-identical to the saved one.
        for level in range(self._depth - 1, -1, -1):
            lo, hi = 1 << level, 2 << level
            left, right = slice(2 * lo, 2 * hi, 2), slice(2 * lo + 1, 2 * hi, 2)
            self._sum_tree[lo:hi] = self._sum_tree[left] + self._sum_tree[right]
            self._min_tree[lo:hi] = np.minimum(self._min_tree[left], self._min_tree[right])
        self._max_priority = float(state["max_priority"])

    def _set_leaves(self, rows: np.ndarray, values: np.ndarray) -> None:
        """Write leaf values for unique ``rows`` and recompute their ancestors."""
        nodes = rows + self._leaves
        self._sum_tree[nodes] = values
        self._min_tree[nodes] = values
        for _ in range(self._depth):
            # Siblings share a parent; writing the same value twice is harmless.
            nodes >>= 1
            left = nodes << 1
            right = left + 1
            self._sum_tree[nodes] = self._sum_tree[left] + self._sum_tree[right]
            self._min_tree[nodes] = np.minimum(self._min_tree[left], self._min_tree[right])

    def _retrieve(self, mass: np.ndarray) -> np.ndarray:
        """Rows whose prefix-sum interval holds ``mass`` (``[B]`` float64 in
        ``[0, total)``): the smallest ``i`` with ``mass < p_0 + ... + p_i``."""
        mass = mass.astype(np.float64, copy=True)
        node = np.ones(mass.shape, dtype=np.int64)
        for _ in range(self._depth):
            node <<= 1
            left_mass = self._sum_tree[node]
            go_right = mass >= left_mass
            np.subtract(mass, left_mass, out=mass, where=go_right)
            node += go_right
        # Rounding at the top of the mass range can walk into the empty leaves past the
        # last stored row; those leaves all lie at >= size.
        return np.minimum(node - self._leaves, self._size - 1)


def _check_beta(beta: float) -> float:
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"importance-sampling beta must be in [0, 1], got {beta}")
    return beta
