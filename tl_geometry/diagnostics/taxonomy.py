"""The features behind the Retriever / Mixer / Reset taxonomy (paper section 4.2, Figures 7 and 10).

For one query row, L is the query's own position (the last visible key) and
the sink is the sequence's first real token where the query can see it;
y_i = alpha_i v_i and s(N) is the selection context's s(N) (the config's
ranking, ties by increasing key index). Per row:

- contributions ||y_sink|| (sink), ||y_L|| (last) and ||sum of the other visible y_i|| (rest);
- curves over N: ||s(N) without the sink|| (s(N) - y_sink if the sink is in
  the top-N set, else s(N)), ||s(N) without the last token||,
  cos(s(N), v_sink) and cos(s(N), v_L); NaN where N exceeds the visible
  keys. ||s(N)|| itself is the selection metric ``s_norm``;
- cos(s(N), v_sink) and cos(s(N), v_L) again, NaN where the top-N set is
  the sink alone (N = 1 with the sink ranked first): there s(N) =
  alpha_sink v_sink, cos(s, v_0) is 1 and cos(s, v_L) is cos(v_0, v_L) by
  construction, so a shift from v_0 towards v_L measured from there would
  hold for nearly every sink-first head (``cos_s_sink_mixed`` and
  ``cos_s_last_mixed``, read by the Mixer rule);
- for Figure 10, ||y_i|| and cos(v_i, v_L) by key position (counted from the
  sink) for the last analysed query of each sequence, NaN at keys it does not see.

Rows that see a single key (sink and last token coincide) carry no
information about the regime and are NaN. Where a query cannot see the sink
(a sliding window that has moved past it), every sink quantity is NaN.
"""

import math
from typing import Any

import einops
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.diagnostics.registry import Diagnostic
from tl_geometry.engine.context import COSINE_EPS, SelectionChunk, SelectionContext, rows_context

CURVE_FEATURES = ("s_norm_without_sink", "s_norm_without_last", "cos_s_sink", "cos_s_last", "cos_s_sink_mixed", "cos_s_last_mixed")
SCALAR_FEATURES = (
    "contribution_sink",
    "contribution_last",
    "contribution_rest",
    "taxonomy_attention_sink",
    "taxonomy_attention_last",
)
POSITION_FEATURES = ("contribution_by_position", "cos_last_by_position")
# Every name the taxonomy diagnostic declares; classify_heads checks a result for these.
TAXONOMY_FEATURES = CURVE_FEATURES + SCALAR_FEATURES + POSITION_FEATURES


def _cosine(a: Float[Tensor, "*#batch d"], b: Float[Tensor, "*#batch d"]) -> Float[Tensor, "*#batch"]:
    """<a, b> / (||a|| ||b|| + 1e-12): 0, not NaN, when either vector is zero."""
    norms = torch.linalg.vector_norm(a, dim=-1) * torch.linalg.vector_norm(b, dim=-1)
    return (a * b).sum(-1) / (norms + COSINE_EPS)


def chunk_features(chunk: SelectionChunk) -> dict[str, Tensor]:
    """The curve and scalar features of every row of a chunk, for every N at once.

    The leave-one-out curves subtract y_sink (y_L) where the sink (last key)
    has rank < N; the rest is the sum of every visible y_i (the last prefix
    sum) minus the sink's and the last token's.
    """
    rows = torch.arange(chunk.n_rows, device=chunk.alpha.device)
    sink, last, has_sink = chunk.sink.clamp(min=0), chunk.last_key, chunk.has_sink
    y_sink = chunk.alpha[rows, sink].unsqueeze(-1) * chunk.values[rows, sink]
    y_last = chunk.alpha[rows, last].unsqueeze(-1) * chunk.values[rows, last]
    grid = chunk.grid
    sink_in = (chunk.sink_rank().unsqueeze(-1) < grid).unsqueeze(-1)  # [row, n, 1]; never for no sink
    last_in = (chunk.rank[rows, last].unsqueeze(-1) < grid).unsqueeze(-1)
    total = chunk.y_sorted.sum(1)  # hidden keys carry alpha = 0: the sum over the visible keys
    rest = total - y_sink * has_sink.unsqueeze(-1) - y_last * (last != chunk.sink).unsqueeze(-1)
    curves = {
        "s_norm_without_sink": torch.linalg.vector_norm(chunk.s - sink_in * y_sink.unsqueeze(1), dim=-1),
        "s_norm_without_last": torch.linalg.vector_norm(chunk.s - last_in * y_last.unsqueeze(1), dim=-1),
        "cos_s_sink": _cosine(chunk.s, chunk.values[rows, sink].unsqueeze(1)),
        "cos_s_last": _cosine(chunk.s, chunk.values[rows, last].unsqueeze(1)),
    }
    single = chunk.n_visible < 2
    beyond = chunk.missing | single.unsqueeze(-1)
    sink_alone = (chunk.sink_rank() == 0).unsqueeze(-1) & (grid == 1)  # s(N) = y_sink: cos(s, v_sink) = 1 by construction
    curves["cos_s_sink_mixed"] = curves["cos_s_sink"].masked_fill(sink_alone, math.nan)
    curves["cos_s_last_mixed"] = curves["cos_s_last"].masked_fill(sink_alone, math.nan)
    out = {name: t.masked_fill(beyond, math.nan) for name, t in curves.items()}
    no_sink = (~has_sink).unsqueeze(-1)
    for name in ("s_norm_without_sink", "cos_s_sink", "cos_s_sink_mixed"):
        out[name] = out[name].masked_fill(no_sink, math.nan)
    scalars = {
        "contribution_sink": torch.linalg.vector_norm(y_sink, dim=-1).masked_fill(~has_sink, math.nan),
        "contribution_last": torch.linalg.vector_norm(y_last, dim=-1),
        "contribution_rest": torch.linalg.vector_norm(rest, dim=-1),
        "taxonomy_attention_sink": chunk.alpha[rows, sink].masked_fill(~has_sink, math.nan),
        "taxonomy_attention_last": chunk.alpha[rows, last],
    }
    out.update({name: t.masked_fill(single, math.nan) for name, t in scalars.items()})
    return out


def position_features(
    alpha: Float[Tensor, "row key"], values: Float[Tensor, "row key d_head"], key_mask: Bool[Tensor, "row key"]
) -> dict[str, Tensor]:
    """Figure 10's per-position view of one query row: ||alpha_i v_i|| and cos(v_i, v_L).

    Returns:
        ``contribution_by_position`` and ``cos_last_by_position``, ``[row, key]``,
        NaN at keys the row does not see.
    """
    positions = torch.arange(key_mask.shape[-1], device=key_mask.device)
    last = (key_mask.long() * (positions + 1)).argmax(-1)
    v_last = values[torch.arange(values.shape[0], device=values.device), last]
    contribution = alpha * torch.linalg.vector_norm(values, dim=-1)
    cos_last = _cosine(values, v_last.unsqueeze(1))
    return {
        "contribution_by_position": contribution.masked_fill(~key_mask, math.nan),
        "cos_last_by_position": cos_last.masked_fill(~key_mask, math.nan),
    }


def row_features(
    alpha: Float[Tensor, "row key"],
    values: Float[Tensor, "row key d_head"],
    key_mask: Bool[Tensor, "row key"],
    grid: Int[Tensor, " n"],
    ranking: str = "attention",
) -> dict[str, Tensor]:
    """The taxonomy features of independent query rows; the sink is each row's first visible key.

    Returns:
        ``CURVE_FEATURES`` as ``[row, n]`` and ``SCALAR_FEATURES`` as ``[row]``.
    """
    positions = torch.arange(key_mask.shape[-1], device=key_mask.device)
    first = torch.where(key_mask, positions, key_mask.shape[-1]).amin(-1)
    context = rows_context(
        alpha.masked_fill(~key_mask, 0.0), values, key_mask, grid,
        ranking=ranking, distance="euclidean", memory_budget_mib=128.0, sink=torch.where(key_mask.any(-1), first, -1),
    )  # fmt: skip
    parts: dict[str, list[Tensor]] = {}
    for chunk in context.chunks():
        for name, t in chunk_features(chunk).items():
            parts.setdefault(name, []).append(t)
    return {name: torch.cat(ts) for name, ts in parts.items()}


class TaxonomyDiagnostic(Diagnostic):
    name = "taxonomy"
    fields = (
        FieldSpec("s_norm_without_sink", "||s(N)|| with the sink left out of the top-N set", ("n",)),
        FieldSpec("s_norm_without_last", "||s(N)|| with the query's own token left out of the top-N set", ("n",)),
        FieldSpec("cos_s_sink", "cos(s(N), v_sink)", ("n",)),
        # The fields the regime rules read. A label's confidence needs their bootstrap replicates, which
        # classify_heads(model, ...) keeps; other runs ask for them with bootstrap_fields (three N curves
        # of replicates would triple the size of a default result file).
        FieldSpec("cos_s_last", "cos(s(N), v_L), L the query's own position", ("n",)),
        FieldSpec("cos_s_sink_mixed", "cos(s(N), v_sink), NaN where the top-N set is the sink alone", ("n",)),
        FieldSpec("cos_s_last_mixed", "cos(s(N), v_L), NaN where the top-N set is the sink alone", ("n",)),
        FieldSpec("contribution_sink", "||alpha_sink v_sink||"),
        FieldSpec("contribution_last", "||alpha_L v_L||"),
        FieldSpec("contribution_rest", "||sum of alpha_i v_i over the other visible keys||"),
        FieldSpec("taxonomy_attention_sink", "attention weight on the sink"),
        FieldSpec("taxonomy_attention_last", "attention weight on the query's own token"),
        FieldSpec("contribution_by_position", "||alpha_i v_i|| by key position (last analysed query)", ("position",), queries="last", documents="mean"),
        FieldSpec("cos_last_by_position", "cos(v_i, v_L) by key position (last analysed query)", ("position",), queries="last", documents="mean"),
    )  # fmt: skip

    def rows(self, chunk: SelectionChunk, settings: Any) -> dict[str, Tensor]:
        return chunk_features(chunk)

    def sequences(self, context: SelectionContext, settings: Any) -> dict[str, Tensor]:
        alpha, visible, _, _ = context.last_query()
        batch, heads, n_keys = alpha.shape
        values = context.values.to(context.dtype)
        by_position = position_features(
            einops.rearrange(alpha, "batch head key -> (batch head) key"),
            einops.rearrange(values, "batch key head d -> (batch head) key d"),
            einops.repeat(visible, "batch key -> (batch head) key", head=heads),
        )
        return {
            name: context.from_first_real(einops.rearrange(t, "(batch head) key -> batch head key", batch=batch))
            for name, t in by_position.items()
        }


DIAGNOSTIC = TaxonomyDiagnostic()
