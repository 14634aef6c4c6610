"""Observation storage kept per Dict entry, so that image entries stay uint8.

The env layer hands a Dict observation on flattened (``EnvSpec.obs_parts``): one float32
row with the pixel values 0-255 of its image entries among the vector entries. Kept like
that, a replay buffer of 84x84 frames with a small vector beside them would take four
times the bytes of the frames. :class:`ObsStore` splits each row as it is written, keeps
every entry in its own tensor (images as uint8, everything else float32) and joins the
rows again, on the storage's device, when they are read. The pixel values are exact in
both dtypes, so a round trip returns the row that was written; the encoders scale them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rlloop.envs.core import EnvSpec

#: Storage name of the legal-action mask features that follow a Dict observation's entries.
MASK_ENTRY = "action_mask"


@dataclass(frozen=True)
class ObsLayout:
    """How one flat observation row ``[D]`` splits into named entries.

    Attributes:
        entries: ``(name, shape, dtype)`` in row order; the widths (products of the
            shapes) add up to ``D``.
    """

    entries: tuple[tuple[str, tuple[int, ...], torch.dtype], ...]

    @classmethod
    def of(cls, spec: EnvSpec) -> ObsLayout | None:
        """The layout of ``spec``'s Dict observations, or None for any other space (whose
        observations are stored whole, in the env's dtype)."""
        if not spec.obs_parts:
            return None
        entries = [(key, shape, torch.uint8 if image else torch.float32)
                   for key, shape, image in spec.obs_parts]
        if spec.action_mask:  # 0/1 features: exact in uint8 too
            entries.append((MASK_ENTRY, (spec.action_mask,), torch.uint8))
        return cls(tuple(entries))

    @property
    def widths(self) -> list[int]:
        return [math.prod(shape) for _, shape, _ in self.entries]

    @property
    def bytes_per_obs(self) -> int:
        """Bytes one stored observation takes."""
        return sum(width * dtype.itemsize
                   for width, (_, _, dtype) in zip(self.widths, self.entries, strict=True))

    def split(self, flat: Tensor) -> Iterator[tuple[str, Tensor]]:
        """``(name, [..., *shape])`` views of the rows ``flat`` ``[..., D]``."""
        lead = flat.shape[:-1]
        for (name, shape, _), x in zip(self.entries, flat.split(self.widths, -1), strict=True):
            yield name, x.reshape(*lead, *shape)

    def join(self, parts: Mapping[str, Tensor]) -> Tensor:
        """Float32 rows ``[..., D]`` from each entry's ``[..., *shape]``."""
        flat = []
        for name, shape, _ in self.entries:
            x = parts[name]
            flat.append(x.reshape(*x.shape[: x.dim() - len(shape)], -1).float())
        return torch.cat(flat, -1)


class ObsStore:
    """Observations ``[*lead, D]`` in one tensor per entry of ``layout``.

    Indexed like the tensor it stands for, over the ``lead`` dims only:
    ``store[i] = rows`` splits ``rows`` (``[..., D]``, any float or uint8 dtype) into
    the entries, ``store[i]`` returns float32 rows ``[..., D]`` on ``device``.
    """

    def __init__(self, lead: tuple[int, ...], layout: ObsLayout,
                 device: torch.device | str = "cpu") -> None:
        self.layout = layout
        self.lead = lead
        self.tensors = {name: torch.zeros((*lead, *shape), dtype=dtype, device=device)
                        for name, shape, dtype in layout.entries}

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def __setitem__(self, index: Any, rows: Tensor) -> None:
        for name, x in self.layout.split(rows):
            self.tensors[name][index] = x  # copy_ converts dtype and device

    def __getitem__(self, index: Any) -> Tensor:
        return self.layout.join({name: t[index] for name, t in self.tensors.items()})
