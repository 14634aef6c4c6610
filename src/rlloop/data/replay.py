"""The replay buffer of the off-policy family (DQN, SAC, TD3): uniform sampling.

It and the prioritized buffer that extends it
(:mod:`rlloop.data.prioritized_replay`) keep every field in one preallocated tensor of
``capacity`` rows and write new transitions circularly (the oldest rows are overwritten
first). ``add`` and ``sample`` are vectorised over the batch; nothing loops in Python per
transition. ``get_state``/``set_state`` carry the full contents and counters, so a
checkpoint restores a buffer that samples exactly what the saved one would have sampled.
"""

from __future__ import annotations

import psutil
import torch
from torch import Tensor

from rlloop.data.obs_storage import ObsLayout
from rlloop.data.transitions import Transitions

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


def check_fits(what: str, capacity: int, nbytes: int, device: torch.device) -> None:
    """Raise ``ReplayMemoryError`` when ``what`` of ``capacity`` transitions, ``nbytes`` of
    storage, would not fit in the memory left on ``device``."""
    available, where = _available_bytes(device)
    if nbytes > available:
        fits = capacity * available // nbytes
        raise ReplayMemoryError(
            f"{what} of capacity {capacity:,} needs {_gib(nbytes)} but only "
            f"{_gib(available)} of {where} are left; lower capacity (below {fits:,})",
            needed=nbytes, available=available, where=where, fits=fits)


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
        if first == count:  # (one op where the write did not wrap: one-env loops add often)
            return torch.arange(start, start + count, device=self.device)
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


