"""Per-sequence reduction of one layer's per-row diagnostic values, filled chunk by chunk.

Each ``"mean"`` field's rows are summed per (sequence, head) with their
counts as the chunks come (NaN rows left out), optionally kept row by row
(``keep_queries``), and, for fields bootstrapped over query rows, summed
again under each row's Poisson weights.
"""

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor


@dataclass
class SequenceReduction:
    """Per-sequence sums and counts of the ``"mean"`` fields of one layer, filled chunk by chunk."""

    n_batch: int
    n_heads: int
    n_queries: int
    keep_queries: bool
    # Two-stage bootstrap of the fields in `resampled`: each query row's Poisson weights, [batch, query, replicate].
    query_weights: Tensor | None = None
    resampled: frozenset[str] = frozenset()
    sums: dict[str, Tensor] = field(default_factory=dict)
    counts: dict[str, Tensor] = field(default_factory=dict)
    rows: dict[str, Tensor] = field(default_factory=dict)
    replicate_sums: dict[str, Tensor] = field(default_factory=dict)
    replicate_counts: dict[str, Tensor] = field(default_factory=dict)
    stacks: dict[str, tuple[str, ...]] = field(default_factory=dict)  # a stack's key -> its fields, in order

    def add(self, name: str, values: Tensor, batch: Tensor, head: Tensor, query: Tensor) -> None:
        """Add per-row values ``[row, *trailing]`` of rows (batch, head, query)."""
        slot = batch * self.n_heads + head
        if name not in self.sums:
            shape = (self.n_batch * self.n_heads, *values.shape[1:])
            self.sums[name] = values.new_zeros(shape)
            self.counts[name] = values.new_zeros(shape)
            if self.keep_queries:
                shape = (self.n_batch, self.n_heads, self.n_queries, *values.shape[1:])
                self.rows[name] = values.new_full(shape, math.nan)
        defined = ~values.isnan()
        # NaN is "undefined here" and not counted; +inf (r_min with every key selected) is a value.
        self.sums[name].index_add_(0, slot, values.nan_to_num(nan=0.0, posinf=math.inf, neginf=-math.inf))
        self.counts[name].index_add_(0, slot, defined.to(values.dtype))
        if self.keep_queries:
            self.rows[name][batch, head, query] = values
        if name in self.resampled and self.query_weights is not None:
            u = self.query_weights[batch, query].to(values.dtype).T  # [replicate, row]
            u = u.reshape(*u.shape, *([1] * (values.ndim - 1)))
            if name not in self.replicate_sums:
                shape = (u.shape[0], self.n_batch * self.n_heads, *values.shape[1:])
                self.replicate_sums[name] = values.new_zeros(shape)
                self.replicate_counts[name] = values.new_zeros(shape)
            self.replicate_sums[name].index_add_(1, slot, u * values.nan_to_num(nan=0.0).unsqueeze(0))
            self.replicate_counts[name].index_add_(1, slot, u * defined.to(values.dtype).unsqueeze(0))

    def add_all(self, rows: dict[str, Tensor], batch: Tensor, head: Tensor, query: Tensor) -> None:
        """`add` every field of one chunk; fields of one shape and dtype go in stacks (one index_add for many)."""
        groups: dict[tuple[Any, ...], list[str]] = {}
        for name, values in rows.items():
            groups.setdefault((values.shape[1:], values.dtype, name in self.resampled), []).append(name)
        for (_, _, resampled), names in groups.items():
            if len(names) == 1:
                self.add(names[0], rows[names[0]], batch, head, query)
                continue
            key = "+".join(names)
            self.stacks[key] = tuple(names)
            if resampled:
                self.resampled = self.resampled | {key}
            self.add(key, torch.stack([rows[name] for name in names], dim=-1), batch, head, query)

    def _unstacked(self, out: dict[str, Tensor]) -> dict[str, Tensor]:
        """``out`` with every stack split back into its fields (the stacked axis is the last)."""
        for key, names in self.stacks.items():
            if key in out:
                stacked = out.pop(key)
                out.update({name: stacked[..., i] for i, name in enumerate(names)})
        return out

    def replicate_means(self) -> dict[str, Tensor]:
        """The query-resampled means of the ``resampled`` fields per replicate, ``[batch, replicate, head_index, *trailing]``."""
        out = {}
        for name, total in self.replicate_sums.items():
            mean = (total / self.replicate_counts[name]).masked_fill(self.replicate_counts[name] == 0, math.nan)
            out[name] = mean.reshape(mean.shape[0], self.n_batch, self.n_heads, *mean.shape[2:]).transpose(0, 1)
        return self._unstacked(out)

    def means(self) -> dict[str, Tensor]:
        """Each field's nanmean over the analysed queries of each sequence, ``[batch, head_index, *trailing]``."""
        return self._unstacked({
            name: (total / self.counts[name]).masked_fill(self.counts[name] == 0, math.nan).reshape(
                self.n_batch, self.n_heads, *total.shape[1:]
            )
            for name, total in self.sums.items()
        })

    def query_rows(self) -> dict[str, Tensor]:
        """Every field's per-query values (``keep_queries``), ``[batch, head_index, query, *trailing]``."""
        return self._unstacked(dict(self.rows))
