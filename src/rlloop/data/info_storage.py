"""Each env step's ``info`` dicts kept beside a replay's rows, as tensors.

A goal env whose reward reads ``info`` (Stable-Baselines3's
``HerReplayBuffer(copy_info_dict=True)``) needs the info of each stored step again when
hindsight replay recomputes that step's reward. :class:`InfoStore` keeps one tensor per
entry, ``[rows, num_envs, *shape]`` in the entry's own dtype (a Python float as float64, a
bool as bool), and a ``[rows, num_envs]`` flag of the rows whose info had it, so that a
step's dict comes back with the entries it had and values equal to the ones given. Nested
dicts are kept entry by entry (their paths). Tensors, not Python objects, so the rows go
into a checkpoint as data and a resumed run reads back the same infos.

Only numbers, bools and numeric arrays of one shape per entry can be kept: anything else
raises :class:`UnstorableInfo` naming the entry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

#: An entry's place in a (nested) info dict: ``("episode", "r")`` for ``info["episode"]["r"]``.
Path = tuple[str, ...]


class UnstorableInfo(ValueError):
    """An info entry that is no number, bool or numeric array, or changed its shape or kind."""


class InfoStore:
    """The infos of ``rows`` x ``num_envs`` steps, written a row (one env step) at a time."""

    def __init__(self, rows: int, num_envs: int, device: torch.device) -> None:
        self.rows, self.num_envs, self.device = rows, num_envs, device
        self.values: dict[Path, Tensor] = {}
        self.present: dict[Path, Tensor] = {}
        self.kinds: dict[Path, tuple[tuple[int, ...], np.dtype]] = {}  # shape, dtype

    def write(self, row: int, infos: Sequence[Mapping[str, Any]]) -> None:
        """Row ``row`` := ``infos``, one dict per env (entries absent from an env's dict
        are absent when its step is read back). Checked before anything is written."""
        if len(infos) != self.num_envs:
            raise ValueError(f"expected one info dict per env ({self.num_envs}), "
                             f"got {len(infos)}")
        flat = [dict(_entries(info, ())) for info in infos]
        columns = []
        for path in dict.fromkeys(p for f in flat for p in f):  # first-seen order
            envs = [e for e, f in enumerate(flat) if path in f]
            arrays = [_numeric(path, flat[e][path]) for e in envs]
            shape, kind = self.kinds.get(path, (arrays[0].shape, arrays[0].dtype))
            for array in arrays:
                if array.shape != shape or not np.can_cast(array.dtype, kind, "safe"):
                    raise UnstorableInfo(f"info{_name(path)} was {shape} {kind} and is now "
                                         f"{array.shape} {array.dtype}; give each entry one "
                                         "shape and kind")
            columns.append((path, envs, np.stack(arrays).astype(kind, copy=False)))
        for path, envs, values in columns:
            store = self.values.get(path)
            if store is None:
                store = self._new_entry(path, values)
            tensor = torch.from_numpy(values).to(self.device)
            if len(envs) == self.num_envs:
                store[row] = tensor
            else:
                store[row, torch.tensor(envs, device=self.device)] = tensor
        if self.present:
            flags = torch.tensor([[path in f for f in flat] for path in self.present],
                                 device=self.device)
            for present, given in zip(self.present.values(), flags, strict=True):
                present[row] = given

    def _new_entry(self, path: Path, values: np.ndarray) -> Tensor:
        store = torch.zeros((self.rows, self.num_envs, *values.shape[1:]),
                            dtype=torch.from_numpy(values[:0]).dtype, device=self.device)
        self.values[path] = store
        self.present[path] = torch.zeros((self.rows, self.num_envs), dtype=torch.bool,
                                         device=self.device)
        self.kinds[path] = (values.shape[1:], values.dtype)
        return store

    def read(self, row: Tensor, env: Tensor) -> np.ndarray:
        """``[B]`` object array of the infos at ``row``, ``env`` ``[B]`` (fresh dicts,
        numpy values), the form Stable-Baselines3 passes to ``compute_reward``."""
        count = len(row)
        dicts: list[dict[str, Any]] = [{} for _ in range(count)]
        for path, store in self.values.items():
            values = store[row, env].cpu().numpy()
            present = self.present[path][row, env].cpu().numpy()
            if len(path) == 1 and present.all():  # the common case, in one pass
                key = path[0]
                for info, value in zip(dicts, values, strict=True):
                    info[key] = value
                continue
            for i in np.flatnonzero(present).tolist():
                _put(dicts[i], path, values[i])
        return np.fromiter(dicts, dtype=object, count=count)

    def get_state(self, held: int) -> list[dict[str, Any]]:
        """The first ``held`` rows of every entry (views: serialise before the next write)."""
        return [{"path": list(path), "values": store[:held], "present": self.present[path][:held]}
                for path, store in self.values.items()]

    def set_state(self, state: list[dict[str, Any]]) -> None:
        self.values, self.present, self.kinds = {}, {}, {}
        for entry in state:
            path, values = tuple(entry["path"]), entry["values"]
            if values.shape[1] != self.num_envs or values.shape[0] > self.rows:
                raise ValueError(f"saved info{_name(path)} has shape {tuple(values.shape)}; "
                                 "was it saved with another num_envs or buffer_size?")
            store = torch.zeros((self.rows, *values.shape[1:]), dtype=values.dtype,
                                device=self.device)
            store[: len(values)] = values.to(self.device)
            present = torch.zeros((self.rows, self.num_envs), dtype=torch.bool,
                                  device=self.device)
            present[: len(values)] = entry["present"].to(self.device)
            self.values[path], self.present[path] = store, present
            self.kinds[path] = (tuple(values.shape[2:]), _numpy_dtype(values.dtype))


def _entries(info: Mapping[str, Any], prefix: Path) -> list[tuple[Path, Any]]:
    out: list[tuple[Path, Any]] = []
    for key, value in info.items():
        if not isinstance(key, str):
            raise UnstorableInfo(f"info{_name(prefix)} has the key {key!r}; give str keys")
        if isinstance(value, Mapping):
            out += _entries(value, (*prefix, key))
        else:
            out.append(((*prefix, key), value))
    return out


def _put(info: dict[str, Any], path: Path, value: Any) -> None:
    for key in path[:-1]:
        info = info.setdefault(key, {})
    info[path[-1]] = value


def _name(path: Path) -> str:
    return "".join(f"[{key!r}]" for key in path)


def _numeric(path: Path, value: Any) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype.kind not in "biuf":
        raise UnstorableInfo(f"info{_name(path)} is a {type(value).__name__}, and only "
                             "numbers, bools and numeric arrays can be stored")
    return array


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.zeros(0, dtype=dtype).numpy().dtype
