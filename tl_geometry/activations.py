"""What the hooks of one layer see, handed to the optional diagnostics.

A diagnostic is a function ``LayerActivations -> dict[str, Tensor]`` whose
tensors are shaped ``[batch, head_index, ...]`` (one row per sequence of the
batch, one per analysed head). The hooks call it once per layer, right after
the selection metrics, and the result gathers each name into
``[sequence, layer, head_index, ...]``. Trailing axes that depend on the
sequence length (positions, lags) must be padded with NaN to ``n_keys`` so
that batches of a corpus can be joined.
"""

from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor


@dataclass(frozen=True)
class LayerActivations:
    """One layer's value states and attention, reduced to what the analysis needs.

    Attributes:
        layer: the layer index.
        values: value states of the analysed heads (GQA-aligned: query head h
            reads KV head h // group), keys 0..n_keys-1, padded keys zeroed,
            ``[batch, key, head_index, d_head]``.
        alpha: attention rows of the analysed queries for the analysed heads,
            hidden keys zeroed, ``[batch, head_index, query, key]``.
        key_mask: keys visible to each analysed query, ``[batch, head_index, query, key]``.
        query_index: position of each analysed query in the (padded) row, ``[batch, query]``.
        query_valid: False where a sequence has no such query, ``[batch, query]``.
        real: which positions are real tokens (not padding), ``[batch, key]``.
        grid: the selection sizes N, ``[n]``.
        kv_heads: the KV head each analysed head reads, ``[head_index]``
            (None: every head its own); see `value_heads`.
    """

    layer: int
    values: Float[Tensor, "batch key head_index d_head"]
    alpha: Float[Tensor, "batch head_index query key"]
    key_mask: Bool[Tensor, "batch head_index query key"]
    query_index: Int[Tensor, "batch query"]
    query_valid: Bool[Tensor, "batch query"]
    real: Bool[Tensor, "batch key"]
    grid: Int[Tensor, " n"]
    kv_heads: Int[Tensor, " head_index"] | None = None

    @property
    def n_keys(self) -> int:
        return self.values.shape[1]

    def last_query(self) -> tuple[Float[Tensor, "batch head_index key"], Bool[Tensor, "batch head_index key"]]:
        """The attention row and visible keys of each sequence's last analysed valid query."""
        last = (self.query_valid.long() * torch.arange(self.query_valid.shape[1])).argmax(-1)  # [batch]
        batch = torch.arange(self.alpha.shape[0])
        return self.alpha[batch, :, last], self.key_mask[batch, :, last]

    def value_heads(self) -> tuple[Int[Tensor, " kv_head"], Int[Tensor, " head_index"]]:
        """One analysed head per distinct KV head, and for each analysed head the index of its one.

        Under grouped-query attention the heads of a group read the same value
        states, so statistics of the values alone need computing once per
        group: ``stats(values[:, :, first])[:, inverse]``.
        """
        n_heads = self.values.shape[2]
        if self.kv_heads is None:
            every = torch.arange(n_heads, device=self.values.device)
            return every, every
        groups, inverse = torch.unique(self.kv_heads, return_inverse=True)
        first = torch.full((len(groups),), n_heads, dtype=torch.long, device=inverse.device)
        first.scatter_reduce_(0, inverse, torch.arange(n_heads, device=inverse.device), reduce="amin")
        return first, inverse
