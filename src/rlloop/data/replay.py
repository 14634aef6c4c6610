"""Replay buffers for the off-policy family (DQN, SAC, TD3): uniform and prioritized.

Both buffers keep every field in one preallocated tensor of ``capacity`` rows and write
new transitions circularly (the oldest rows are overwritten first). ``add`` and
``sample`` are vectorised over the batch; nothing loops in Python per transition.
``get_state``/``set_state`` carry the full contents and counters, so a checkpoint
restores a buffer that samples exactly what the saved one would have sampled.
"""

from __future__ import annotations

import numpy as np
import psutil
import torch
from torch import Tensor

from rlloop.data.obs_storage import ObsLayout
from rlloop.data.transitions import Transitions
from rlloop.system.devices import stats_dtype

#: The fields of a transition that hold observations.
_OBS_FIELDS = ("obs", "next_obs")


class ReplayMemoryError(MemoryError, ValueError):
    """The buffer would not fit in memory. Raised by the constructor before allocating.

    Also a ``ValueError``: it is a bad configuration value (``capacity``), caught where
    other config errors are. ``fits`` is the largest capacity that would fit, for callers
    that name their own config key in the message.
    """

    def __init__(self, message: str, *, needed: int = 0, available: int = 0, where: str = "",
                 fits: int = 0) -> None:
        super().__init__(message)
        self.needed, self.available, self.where, self.fits = needed, available, where, fits


def _available_bytes(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free), f"free memory on {device}"
    return int(psutil.virtual_memory().available), "available RAM"


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB"


def _host_uniform(size: int, generator: torch.Generator | None) -> np.ndarray:
    """``size`` uniform [0, 1) float64 draws from ``generator`` (on its device; float32
    on MPS, which has no float64), on the host."""
    device = generator.device if generator is not None else torch.device("cpu")
    draw = torch.rand(size, generator=generator, dtype=stats_dtype(device), device=device)
    return draw.cpu().double().numpy()


class ReplayBuffer:
    """Uniform replay over the last ``capacity`` transitions.

    Args:
        capacity: Number of transitions kept.
        obs_shape: Shape of one observation.
        action_shape: Shape of one action; ``()`` for discrete actions.
        action_dtype: ``torch.int64`` for discrete actions, a float dtype otherwise.
        device: Where storage lives and sampled batches are returned.
        obs_dtype: Storage dtype of ``obs``/``next_obs`` (``torch.uint8`` for pixels;
            sampled batches keep it, the network converts).
        obs_layout: Dict observations (see :mod:`rlloop.data.obs_storage`): ``obs`` and
            ``next_obs`` are kept per entry (``"obs.<key>"``, image entries uint8) and
            sampled as float32 rows; ``obs_dtype`` is then unused.

    Raises:
        ReplayMemoryError: ``nbytes`` exceeds the memory available on ``device``.
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
    ) -> None:
        if capacity < 1:
            raise ValueError(f"replay capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.obs_shape = tuple(obs_shape)
        self.action_shape = tuple(action_shape)
        self.device = torch.device(device)
        self._shapes = {
            "obs": self.obs_shape,
            "action": self.action_shape,
            "reward": (),
            "next_obs": self.obs_shape,
            "terminated": (),
            "discount": (),
        }
        self._dtypes = {
            "obs": obs_dtype,
            "action": action_dtype,
            "reward": torch.float32,
            "next_obs": obs_dtype,
            "terminated": torch.bool,
            "discount": torch.float32,
        }
        #: Each transition field's shape, checked by ``add`` (storage may split ``obs``).
        self._field_shapes = dict(self._shapes)
        self.obs_layout = obs_layout
        if obs_layout is not None:
            for field in _OBS_FIELDS:
                del self._shapes[field], self._dtypes[field]
                for name, shape, dtype in obs_layout.entries:
                    self._shapes[f"{field}.{name}"] = shape
                    self._dtypes[f"{field}.{name}"] = dtype
        self.nbytes = self._required_nbytes()
        available, where = _available_bytes(self.device)
        if self.nbytes > available:
            fits = capacity * available // self.nbytes
            raise ReplayMemoryError(
                f"replay buffer of capacity {capacity:,} needs {self.nbytes:,} bytes "
                f"({_gib(self.nbytes)}) but only {available:,} bytes ({_gib(available)}) of "
                f"{where} are left; lower capacity (below {fits:,} would fit)",
                needed=self.nbytes, available=available, where=where, fits=fits,
            )
        self._storage = {
            name: torch.zeros((capacity, *self._shapes[name]), dtype=dtype, device=self.device)
            for name, dtype in self._dtypes.items()
        }
        self._pos = 0  # row the next transition is written to
        self._size = 0

    def _required_nbytes(self) -> int:
        """Bytes of all preallocated storage, computed before allocating it."""
        per_row = 0
        for name, dtype in self._dtypes.items():
            numel = 1
            for s in self._shapes[name]:
                numel *= s
            per_row += numel * dtype.itemsize
        return self.capacity * per_row

    def __len__(self) -> int:
        return self._size

    def add(self, batch: Transitions) -> Tensor:
        """Write ``N`` transitions (each field ``[N, ...]``), overwriting the oldest.

        When ``N > capacity`` only the newest ``capacity`` transitions are kept, as if
        they had been added one by one.

        Returns:
            ``[min(N, capacity)]`` int64 rows written.
        """
        n = self._check_batch(batch)
        skip = max(0, n - self.capacity)
        start, count = (self._pos + skip) % self.capacity, n - skip
        # At most two contiguous slices (the second when the write wraps around): slice
        # copies cost a fraction of an index_put, and one-env loops add every env step.
        first = min(count, self.capacity - start)
        columns = None if self.obs_layout is None else self._columns(batch)
        for name, store in self._storage.items():
            value = getattr(batch, name) if columns is None else columns[name]
            if skip:
                value = value[skip:]
            if first == count:
                store[start : start + count] = value  # copy_ converts device and dtype
            else:
                store[start:] = value[:first]
                store[: count - first] = value[first:]
        self._pos = (self._pos + n) % self.capacity
        self._size = min(self._size + n, self.capacity)
        return (start + torch.arange(count, device=self.device)) % self.capacity

    def _columns(self, batch: Transitions) -> dict[str, Tensor]:
        """``{storage name: [N, ...]}`` of ``batch`` with its observations split per entry
        (``obs_layout``)."""
        assert self.obs_layout is not None
        columns: dict[str, Tensor] = {}
        for field in self._field_shapes:
            value = getattr(batch, field)
            if field in _OBS_FIELDS:
                columns.update((f"{field}.{k}", x) for k, x in self.obs_layout.split(value))
            else:
                columns[field] = value
        return columns

    def _obs(self, field: str, rows: Tensor) -> Tensor:
        """``[B, *obs_shape]`` observations of ``field`` at storage ``rows``."""
        if self.obs_layout is None:
            return self._storage[field][rows]
        return self.obs_layout.join({name: self._storage[f"{field}.{name}"][rows]
                                     for name, _, _ in self.obs_layout.entries})

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> Transitions:
        """``batch_size`` transitions drawn uniformly with replacement.

        Returns:
            ``Transitions`` of ``[batch_size, ...]`` with ``indices`` set and
            ``weights=None``.
        """
        self._check_can_sample(batch_size)
        gen_device = generator.device if generator is not None else self.device
        rows = torch.randint(self._size, (batch_size,), generator=generator, device=gen_device)
        return self._gather(rows.to(self.device))

    def get_state(self) -> dict[str, Tensor | int | float]:
        """Contents (``[len(self), ...]`` tensors) and counters.

        The tensors are views of the live storage, not copies (a replay buffer can be
        most of the machine's memory): serialise them before the next ``add``.
        """
        state: dict[str, Tensor | int | float] = {
            name: store[: self._size] for name, store in self._storage.items()
        }
        state.update(capacity=self.capacity, pos=self._pos, size=self._size)
        return state

    def set_state(self, state: dict[str, Tensor | int | float]) -> None:
        """Restore contents and counters saved by ``get_state``."""
        if int(state["capacity"]) != self.capacity:
            raise ValueError(
                f"replay state has capacity {state['capacity']} but this buffer has "
                f"{self.capacity}; build the buffer with the saved capacity"
            )
        size, pos = int(state["size"]), int(state["pos"])
        if not 0 <= size <= self.capacity or not 0 <= pos < self.capacity:
            raise ValueError(f"replay state has bad counters size={size}, pos={pos}")
        for name, store in self._storage.items():
            value = state[name]
            if not isinstance(value, Tensor) or tuple(value.shape) != (size, *self._shapes[name]):
                raise ValueError(
                    f"replay state '{name}' must be a tensor of shape {(size, *self._shapes[name])}"
                )
            store[:size] = value.to(self.device, store.dtype)
        self._size, self._pos = size, pos

    def _gather(self, rows: Tensor, weights: Tensor | None = None) -> Transitions:
        s = self._storage
        return Transitions(
            obs=self._obs("obs", rows),
            action=s["action"][rows],
            reward=s["reward"][rows],
            next_obs=self._obs("next_obs", rows),
            terminated=s["terminated"][rows],
            discount=s["discount"][rows],
            weights=weights,
            indices=rows,
        )

    def _check_batch(self, batch: Transitions) -> int:
        n = batch.reward.shape[0]
        for name, shape in self._field_shapes.items():
            got = tuple(getattr(batch, name).shape)
            if got != (n, *shape):
                raise ValueError(
                    f"transitions.{name} has shape {got}, expected {(n, *shape)} "
                    f"(N={n} from reward)"
                )
        return n

    def _check_can_sample(self, batch_size: int) -> None:
        if self._size == 0:
            raise ValueError("cannot sample from an empty replay buffer; add transitions first")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")


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
