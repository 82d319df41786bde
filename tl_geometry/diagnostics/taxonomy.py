"""The features behind the Retriever / Mixer / Reset taxonomy (paper section 4.2, Figures 7 and 10).

For one query row with visible keys 0..L (L = the query's own position, the
last visible key; the sink is the first visible key, position 0 / BOS when
the sequence is not left-padded), y_i = alpha_i v_i and
s(N) = sum of y_i over the top-N keys by attention weight (ties by increasing
key index, as `tl_geometry.engine.selection.selection_order`). Per row:

- contributions ||y_0|| (sink), ||y_L|| (last) and ||sum of the other y_i|| (rest);
- curves over N: ||s(N)||, ||s(N) without the sink|| (s(N) - y_0 if the sink
  is in the top-N set, else s(N)), ||s(N) without the last token||,
  cos(s(N), v_0) and cos(s(N), v_L); NaN where N exceeds the visible keys;
- for Figure 10, ||y_i|| and cos(v_i, v_L) by key position for the last
  analysed query of each sequence, NaN at keys it does not see.

Rows that see a single key (sink and last token coincide) carry no
information about the regime and are left out (NaN). Per sequence, the
features are the nanmean over its valid analysed queries.
"""

import math

import einops
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from tl_geometry.activations import LayerActivations
from tl_geometry.engine.selection import COSINE_EPS, selection_order, working_dtype

# Working memory of one chunk of queries (the rows hold per-query copies of the values).
FEATURE_BUDGET_MIB = 64

CURVE_FEATURES = ("taxonomy_s_norm", "s_norm_without_sink", "s_norm_without_last", "cos_s_sink", "cos_s_last")
SCALAR_FEATURES = (
    "contribution_sink",
    "contribution_last",
    "contribution_rest",
    "taxonomy_attention_sink",
    "taxonomy_attention_last",
)
POSITION_FEATURES = ("contribution_by_position", "cos_last_by_position")
# Every name taxonomy_features returns; classify_heads checks a result for these.
TAXONOMY_FEATURES = CURVE_FEATURES + SCALAR_FEATURES + POSITION_FEATURES


def _cosine(a: Float[Tensor, "*#batch d"], b: Float[Tensor, "*#batch d"]) -> Float[Tensor, "*#batch"]:
    """<a, b> / (||a|| ||b|| + 1e-12): 0, not NaN, when either vector is zero."""
    norms = torch.linalg.vector_norm(a, dim=-1) * torch.linalg.vector_norm(b, dim=-1)
    return (a * b).sum(-1) / (norms + COSINE_EPS)


def sink_and_last(key_mask: Bool[Tensor, "*batch key"]) -> tuple[Int[Tensor, "*batch"], Int[Tensor, "*batch"]]:
    """Index of the first (sink) and last (current token) visible key of each row.

    >>> sink_and_last(torch.tensor([[False, True, True, False]]))
    (tensor([1]), tensor([2]))
    """
    positions = torch.arange(key_mask.shape[-1], device=key_mask.device)
    sink = key_mask.int().argmax(-1)
    last = (key_mask.long() * (positions + 1)).argmax(-1)
    return sink, last


def row_features(
    alpha: Float[Tensor, "row key"],
    values: Float[Tensor, "row key d_head"],
    key_mask: Bool[Tensor, "row key"],
    grid: Int[Tensor, " n"],
) -> dict[str, Tensor]:
    """The taxonomy features of each query row, for every N of the grid at once.

    s(N) for all N comes from the prefix sums of the contributions sorted by
    attention; the leave-one-out variants subtract y_0 (y_L) where the sink
    (last key) has rank < N.

    Args:
        alpha: attention weights, hidden keys ignored.
        values: value vectors of the keys.
        key_mask: visible keys; the sink is the first, the last token the last.
        grid: selection sizes N.

    Returns:
        ``CURVE_FEATURES`` as ``[row, n]`` (NaN where N exceeds the visible
        keys) and ``SCALAR_FEATURES`` as ``[row]``; rows with fewer than two
        visible keys are NaN throughout.
    """
    dtype = working_dtype(alpha, values)
    alpha, values = alpha.to(dtype), values.to(dtype)
    n_keys = alpha.shape[-1]
    rows = torch.arange(alpha.shape[0], device=alpha.device)
    sink, last = sink_and_last(key_mask)
    alpha = alpha.masked_fill(~key_mask, 0.0)
    y = alpha.unsqueeze(-1) * values
    order = selection_order(alpha, values, key_mask, "attention")
    prefix = torch.cumsum(torch.gather(y, 1, order.unsqueeze(-1).expand_as(y)), dim=1)
    s = prefix[:, grid.clamp(max=n_keys) - 1]  # [row, n, d_head]
    # rank[row, key]: the key's place in the order (the inverse permutation).
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(n_keys, device=order.device).expand_as(order))
    y_sink, y_last = y[rows, sink], y[rows, last]
    sink_in = (rank[rows, sink].unsqueeze(-1) < grid).unsqueeze(-1)  # [row, n, 1]
    last_in = (rank[rows, last].unsqueeze(-1) < grid).unsqueeze(-1)
    without_sink = s - sink_in * y_sink.unsqueeze(1)
    without_last = s - last_in * y_last.unsqueeze(1)
    others = key_mask.clone()
    others[rows, sink] = False
    others[rows, last] = False
    rest = (y * others.unsqueeze(-1)).sum(1)
    n_visible = key_mask.sum(-1)
    curves = {
        "taxonomy_s_norm": torch.linalg.vector_norm(s, dim=-1),
        "s_norm_without_sink": torch.linalg.vector_norm(without_sink, dim=-1),
        "s_norm_without_last": torch.linalg.vector_norm(without_last, dim=-1),
        "cos_s_sink": _cosine(s, values[rows, sink].unsqueeze(1)),
        "cos_s_last": _cosine(s, values[rows, last].unsqueeze(1)),
    }
    beyond = (grid > n_visible.unsqueeze(-1)) | (n_visible < 2).unsqueeze(-1)
    out = {name: t.masked_fill(beyond, math.nan) for name, t in curves.items()}
    scalars = {
        "contribution_sink": torch.linalg.vector_norm(y_sink, dim=-1),
        "contribution_last": torch.linalg.vector_norm(y_last, dim=-1),
        "contribution_rest": torch.linalg.vector_norm(rest, dim=-1),
        "taxonomy_attention_sink": alpha[rows, sink],
        "taxonomy_attention_last": alpha[rows, last],
    }
    out.update({name: t.masked_fill(n_visible < 2, math.nan) for name, t in scalars.items()})
    return out


def position_features(
    alpha: Float[Tensor, "row key"], values: Float[Tensor, "row key d_head"], key_mask: Bool[Tensor, "row key"]
) -> dict[str, Tensor]:
    """Figure 10's per-position view of one query row: ||alpha_i v_i|| and cos(v_i, v_L).

    Returns:
        ``contribution_by_position`` and ``cos_last_by_position``, ``[row, key]``,
        NaN at keys the row does not see.
    """
    dtype = working_dtype(alpha, values)
    alpha, values = alpha.to(dtype), values.to(dtype)
    _, last = sink_and_last(key_mask)
    v_last = values[torch.arange(values.shape[0], device=values.device), last]
    contribution = alpha * torch.linalg.vector_norm(values, dim=-1)
    cos_last = _cosine(values, v_last.unsqueeze(1))
    return {
        "contribution_by_position": contribution.masked_fill(~key_mask, math.nan),
        "cos_last_by_position": cos_last.masked_fill(~key_mask, math.nan),
    }


def _query_chunk(seen: LayerActivations) -> int:
    """Queries per chunk so that the per-query copies of the values fit the budget."""
    batch, n_keys, n_heads, d_head = seen.values.shape
    per_query = 4 * batch * n_keys * n_heads * max(d_head, 1) * 8
    return max(1, int(FEATURE_BUDGET_MIB * 2**20 // per_query))


def taxonomy_features(seen: LayerActivations) -> dict[str, Tensor]:
    """The per-sequence taxonomy features of one layer (the ``"taxonomy"`` diagnostic).

    Args:
        seen: what the hooks of one layer saw (see `LayerActivations`).

    Returns:
        ``CURVE_FEATURES`` as ``[batch, head_index, n]`` and ``SCALAR_FEATURES``
        as ``[batch, head_index]``, each the nanmean over the sequence's valid
        analysed queries; ``POSITION_FEATURES`` as ``[batch, head_index, key]``
        (key padded with NaN to ``seen.n_keys``) for each sequence's last
        analysed query.
    """
    n_queries = seen.alpha.shape[2]
    size = _query_chunk(seen)
    per_query: dict[str, list[Tensor]] = {}
    for start in range(0, n_queries, size):
        alpha = seen.alpha[:, :, start : start + size]
        q = alpha.shape[2]
        values = einops.repeat(seen.values, "batch key head d -> (batch head query) key d", query=q)
        features = row_features(
            einops.rearrange(alpha, "batch head query key -> (batch head query) key"),
            values,
            einops.rearrange(seen.key_mask[:, :, start : start + size], "batch head query key -> (batch head query) key"),
            seen.grid.to(alpha.device),
        )
        batch, heads = alpha.shape[:2]
        for name, t in features.items():
            per_query.setdefault(name, []).append(
                einops.rearrange(t, "(batch head query) ... -> batch head query ...", batch=batch, head=heads)
            )
    invalid = ~seen.query_valid[:, None, :]  # [batch, 1, query]
    out = {}
    for name, chunks in per_query.items():
        t = torch.cat(chunks, dim=2)
        mask = invalid if t.ndim == 3 else invalid.unsqueeze(-1)
        out[name] = torch.nanmean(t.masked_fill(mask, math.nan), dim=2)
    alpha_last, mask_last = seen.last_query()
    batch, heads = alpha_last.shape[:2]
    by_position = position_features(
        einops.rearrange(alpha_last, "batch head key -> (batch head) key"),
        einops.rearrange(seen.values, "batch key head d -> (batch head) key d"),
        einops.rearrange(mask_last, "batch head key -> (batch head) key"),
    )
    out.update(
        {
            name: einops.rearrange(t, "(batch head) key -> batch head key", batch=batch, head=heads)
            for name, t in by_position.items()
        }
    )
    return out
