"""The base of every typed batch: a frozen dataclass of ``[B, ...]`` tensors that knows its
length and selects rows (rollouts, sequences, replay samples)."""

from __future__ import annotations

import dataclasses

from torch import Tensor


class TensorBatch:
    """Mixin for frozen dataclasses of ``[B, ...]`` tensors: length and row selection."""

    def __len__(self) -> int:
        return int(getattr(self, dataclasses.fields(self)[0].name).shape[0])  # type: ignore[arg-type]

    def select(self, index: Tensor):  # type: ignore[no-untyped-def]
        """The rows ``index`` of every field (``None`` fields stay ``None``)."""
        return dataclasses.replace(  # type: ignore[type-var]
            self,  # type: ignore[arg-type]
            **{f.name: (v[index] if (v := getattr(self, f.name)) is not None else None)
               for f in dataclasses.fields(self)},  # type: ignore[arg-type]
        )

    def num_samples(self) -> int | Tensor:
        """The samples this batch trains on: its rows (a batch of padded sequences counts
        its real steps, as a tensor, so that counting never waits for the device)."""
        return len(self)

    def rows(self, start: int, stop: int):  # type: ignore[no-untyped-def]
        """Rows ``start:stop`` of every field as views (no copy)."""
        return self.select(slice(start, stop))  # type: ignore[arg-type]
