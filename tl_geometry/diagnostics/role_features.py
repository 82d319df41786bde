"""The features behind the head roles, Retriever / Mixer / Reset (paper section 4.2, Figures 7 and 10).

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

The role features (read by `tl_geometry.analysis.head_roles`), per row, with
o = sum of y_i over the visible keys (the head's output before W_O):

- composition: the shares of the sink, of the query's own token and of the
  rest in o, as projections <y_k, o> / ||o||^2 (they sum to 1; a part that
  points against o has a negative share), and the leave-one-out norms
  ||o - y_sink|| / ||o|| and ||o - y_L|| / ||o|| (Figure 7 at N = all keys);
- concentration of the rest (visible keys other than the sink and the query's
  own): p_i = alpha_i / (their total weight); the effective number of keys
  exp(-sum p_i log p_i), and as a share of the rest's keys; the top rest key's
  share p_max, and the indicator that its lag L - i is 1 (the previous token);
- what a sub-type names: at each lag k = 0..reach-1 behind the query (the key
  L - k), whether that key is the row's top rest key, its attention weight
  and its output share <y_k, o> / ||o||^2. A row that cannot reach the lag
  holds 0 there, not NaN, so that a head's mean is a share of *all* its rows:
  two late rows out of twelve that reach lag 948 make 1/6, not 100 %. And the
  early keys (positions 1..early-1 after the sink, other than the query's
  own), for rows whose query is at least 2 x early past the sink (later
  rows; earlier ones are NaN): whether the top rest key is an early key, its
  position, and the largest weight on an early key with that key's output
  share. A secondary sink is an early key that wins the later rows; which
  key it is varies from document to document (an early " the"), so these
  features do not fix its position;
- the paper's quantities read literally: the largest single contribution
  ||alpha_i v_i|| among the rest's keys (beside ||y_sink|| and ||y_L||), and
  the raw cosines cos(s(N), v_sink) and cos(s(N), v_L), their mean over
  1 <= N < n and their slope against ln N (the point where the top-N set is
  the sink alone left out);
- alignment over chance: cos(s(N), v) - c(N) for v = v_sink and v = v_L,
  where c(N) is the mean of cos(S_c(N), v) over ``ROLE_CONTROLS`` random
  rankings c of the visible keys, S_c(N) the sum of y_i over the first N keys
  of ranking c (the same weights, a random set; the rankings are the chance
  diagnostic's, nested across N and seeded by the roles diagnostic's seed). The mean
  of a cosine, not the cosine of mean sums: where every y_i points the same
  way, a random set is as aligned as the top-N set and the excess is 0. The
  row's mean excess over
  the grid's N with 1 <= N < n (at N = n both sums are o and the excess is 0
  by construction), and its shift: the least-squares slope of the excess
  against ln N over the same N, the point where the top-N set is the sink
  alone left out (as for the ``_mixed`` cosines).

Rows that see a single key (sink and last token coincide) carry no
information about the role and are NaN. Where a query cannot see the sink
(a sliding window that has moved past it), every sink quantity is NaN.
"""

import math
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, get_args

import einops
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from tl_geometry._renamed import old_names
from tl_geometry.diagnostics.chance import control_orders
from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.diagnostics.registry import Diagnostic
from tl_geometry.engine.context import COSINE_EPS, RowCost, SelectionChunk, SelectionContext, rows_context
from tl_geometry.errors import GeometryError

# Query positions sampled per sequence for the role features (docs: how to read a head, the stability figure).
DEFAULT_QUERY_SAMPLE = 8
# Random rankings per row for the alignment's chance level: one is unbiased, and the excess is averaged over
# every sampled row of every document (docs: Head roles, what the roles diagnostic costs).
ROLE_CONTROLS = 1

CURVE_FEATURES = ("s_norm_without_sink", "s_norm_without_last", "cos_s_sink", "cos_s_last", "cos_s_sink_mixed", "cos_s_last_mixed")
SCALAR_FEATURES = (
    "contribution_sink",
    "contribution_last",
    "contribution_rest",
    "role_attention_sink",
    "role_attention_last",
)
POSITION_FEATURES = ("contribution_by_position", "cos_last_by_position")
# What the role rules read: one value per row, kept with two-stage bootstrap replicates (documents, then
# the query rows within each document), so that every head gets role probabilities.
ROLE_FEATURES = (
    "share_sink", "share_self", "share_rest", "rest_effective_share", "top_rest_share", "previous_token",
    "align_sink_excess", "align_self_excess", "shift_sink_raw", "shift_self_raw",
)  # fmt: skip
# The paper's rules read literally (norms and raw cosines; docs: Head roles, two readings), and what the rules of
# earlier versions read (the shift of the excess over chance).
LITERAL_FEATURES = ("contribution_top_rest", "cos_sink_raw", "cos_self_raw")
ROLE_EXTRAS = ("loo_sink", "loo_self", "rest_effective_keys", "shift_sink", "shift_self") + LITERAL_FEATURES
ROLE_CURVES = ("excess_cos_sink", "excess_cos_self")
# What the sub-types read: by lag 0..reach-1 over every sampled row (a row that cannot reach a lag counts 0
# there), and the early keys over the later rows.
LAG_FEATURES = ("top_rest_at_lag", "attention_at_lag", "output_share_at_lag")
EARLY_FEATURES = ("early_top_rest", "early_position", "early_attention", "early_output_share")
SUBTYPE_FEATURES = LAG_FEATURES + EARLY_FEATURES
# Lags a sub-type can name (RoleSettings.reach): a fixed width, so that every row counts at every lag
# whatever the batch's length.
DEFAULT_REACH = 64
# Keys at positions 1..DEFAULT_EARLY-1 after the sink are early (RoleSettings.early).
DEFAULT_EARLY = 16
# Every name the roles diagnostic declares; classify_heads checks a result for these.
ROLE_DIAGNOSTIC_FIELDS = (
    CURVE_FEATURES + SCALAR_FEATURES + POSITION_FEATURES + ROLE_FEATURES + ROLE_EXTRAS + ROLE_CURVES + SUBTYPE_FEATURES
)


def _cosine(a: Float[Tensor, "*#batch d"], b: Float[Tensor, "*#batch d"]) -> Float[Tensor, "*#batch"]:
    """<a, b> / (||a|| ||b|| + 1e-12): 0, not NaN, when either vector is zero."""
    norms = torch.linalg.vector_norm(a, dim=-1) * torch.linalg.vector_norm(b, dim=-1)
    return (a * b).sum(-1) / (norms + COSINE_EPS)


def chunk_features(
    chunk: SelectionChunk, seed: int = 0, reach: int = DEFAULT_REACH, early: int = DEFAULT_EARLY
) -> dict[str, Tensor]:
    """The curve and scalar features of every row of a chunk, for every N at once.

    The leave-one-out curves subtract y_sink (y_L) where the sink (last key)
    has rank < N; the rest is the sum of every visible y_i minus the sink's
    and the last token's. Whatever runs over ranks stops at the ranks some
    row of the chunk sees (`SelectionChunk.seen_ranks`): hidden keys sort
    last, so past them every rank is hidden in every row (a sliding-window
    row of a long context: its window's width, not the whole key axis).
    """
    rows = torch.arange(chunk.n_rows, device=chunk.alpha.device)
    sink, last, has_sink = chunk.sink.clamp(min=0), chunk.last_key, chunk.has_sink
    v_sink, v_last = chunk.value_of(sink), chunk.value_of(last)
    y_sink = chunk.alpha[rows, sink].unsqueeze(-1) * v_sink
    y_last = chunk.alpha[rows, last].unsqueeze(-1) * v_last
    grid = chunk.grid
    sink_in = (chunk.sink_rank().unsqueeze(-1) < grid).unsqueeze(-1)  # [row, n, 1]; never for no sink
    last_in = (chunk.rank[rows, last].unsqueeze(-1) < grid).unsqueeze(-1)
    total = chunk.y_sorted[:, : chunk.seen_ranks()].sum(1)  # the sum over the visible keys
    rest = total - y_sink * has_sink.unsqueeze(-1) - y_last * (last != chunk.sink).unsqueeze(-1)
    curves = {
        "s_norm_without_sink": torch.linalg.vector_norm(chunk.s - sink_in * y_sink.unsqueeze(1), dim=-1),
        "s_norm_without_last": torch.linalg.vector_norm(chunk.s - last_in * y_last.unsqueeze(1), dim=-1),
        "cos_s_sink": _cosine(chunk.s, v_sink.unsqueeze(1)),
        "cos_s_last": _cosine(chunk.s, v_last.unsqueeze(1)),
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
        "role_attention_sink": chunk.alpha[rows, sink].masked_fill(~has_sink, math.nan),
        "role_attention_last": chunk.alpha[rows, last],
    }
    out.update({name: t.masked_fill(single, math.nan) for name, t in scalars.items()})
    rest = rest_keys(chunk)
    out.update(role_features(chunk, rest, y_sink, y_last, total, seed))
    out.update(subtype_features(chunk, rest, total, reach, early))
    return out


def _slope(y: Float[Tensor, "row n"], x: Float[Tensor, " n"], use: Bool[Tensor, "row n"]) -> Float[Tensor, " row"]:
    """Least-squares slope of y against x over the points in ``use`` (NaN with fewer than two distinct x)."""
    w = use.to(y.dtype)
    count = w.sum(-1)
    x_mean = (w * x).sum(-1) / count
    y_mean = (w * y.nan_to_num(0.0)).sum(-1) / count
    dx = (x - x_mean.unsqueeze(-1)) * w
    spread = (dx * dx).sum(-1)
    slope = (dx * (y.nan_to_num(0.0) - y_mean.unsqueeze(-1))).sum(-1) / spread
    return slope.masked_fill(spread <= 0, math.nan)


class RestKeys(NamedTuple):
    """The rest of each row (visible keys other than the sink and the query's own), read by the role and sub-type features."""

    mask: Bool[Tensor, "row key"]
    alpha: Float[Tensor, "row key"]  # the rest's weights, 0 elsewhere
    top: Int[Tensor, " row"]  # the top rest key; ties: the smallest key index
    defined: Bool[Tensor, " row"]  # the rest carries weight


def rest_keys(chunk: SelectionChunk) -> RestKeys:
    """The rest of every row of a chunk."""
    sink, last, has_sink = chunk.sink.clamp(min=0), chunk.last_key, chunk.has_sink
    keys = torch.arange(chunk.alpha.shape[-1], device=chunk.alpha.device)
    mask = chunk.visible & (keys != last.unsqueeze(-1)) & ~((keys == sink.unsqueeze(-1)) & has_sink.unsqueeze(-1))
    alpha = chunk.alpha.masked_fill(~mask, 0.0)
    return RestKeys(mask, alpha, alpha.masked_fill(~mask, -1.0).argmax(-1), alpha.sum(-1) > 0)


def role_features(
    chunk: SelectionChunk, rest_of: RestKeys, y_sink: Tensor, y_last: Tensor, total: Tensor, seed: int = 0
) -> dict[str, Tensor]:
    """Composition, concentration of the rest and alignment over chance of every row (module docstring)."""
    rows = torch.arange(chunk.n_rows, device=chunk.alpha.device)
    sink, last, has_sink = chunk.sink.clamp(min=0), chunk.last_key, chunk.has_sink
    o_sq = (total * total).sum(-1)
    defined = o_sq > 0
    o_norm = o_sq.sqrt()
    share_sink = ((y_sink * total).sum(-1) / o_sq).masked_fill(~has_sink, math.nan)
    share_self = (y_last * total).sum(-1) / o_sq
    rest = total - y_sink * has_sink.unsqueeze(-1) - y_last
    out = {
        "share_sink": share_sink,
        "share_self": share_self,
        "share_rest": (rest * total).sum(-1) / o_sq,
        "loo_sink": (torch.linalg.vector_norm(total - y_sink, dim=-1) / o_norm).masked_fill(~has_sink, math.nan),
        "loo_self": torch.linalg.vector_norm(total - y_last, dim=-1) / o_norm,
    }
    out = {name: t.masked_fill(~defined, math.nan) for name, t in out.items()}
    is_rest, has_rest, top = rest_of.mask, rest_of.defined, rest_of.top
    p = rest_of.alpha / rest_of.alpha.sum(-1, keepdim=True)
    entropy = -torch.special.xlogy(p, p).sum(-1)
    n_rest = is_rest.sum(-1).to(p.dtype)
    lag = (last - top).masked_fill(~has_rest, 0)
    out["rest_effective_keys"] = entropy.exp()
    out["rest_effective_share"] = entropy.exp() / n_rest
    out["top_rest_share"] = p[rows, top]
    out["previous_token"] = (lag == 1).to(p.dtype)
    for name in ("rest_effective_keys", "rest_effective_share", "top_rest_share", "previous_token"):
        out[name] = out[name].masked_fill(~has_rest, math.nan)
    # Per rank, only the ranks some row of the chunk sees: every rank past them is hidden in every row.
    ranks = chunk.seen_ranks()
    y = chunk.y_sorted[:, :ranks]
    # The paper's magnitudes: the largest single contribution ||alpha_i v_i|| among the rest (0 without rest keys).
    norms = torch.linalg.vector_norm(y, dim=-1).masked_fill(~is_rest.gather(1, chunk.order[:, :ranks]), 0.0)
    out["contribution_top_rest"] = norms.amax(-1)
    # Alignment over chance: the mean cosine of random top-N sets, drawn as the chance diagnostic draws them
    # (nested random rankings of the visible keys; hidden keys rank last, so N < n never reaches them), over the
    # seen ranks: the same first places as over the whole order, and nothing past them to add.
    places = control_orders(chunk, ROLE_CONTROLS, seed, ranks)  # [row, control, place] -> rank in chunk.order
    n_rows = chunk.n_rows
    place_of_rank = torch.empty_like(places).scatter_(
        -1, places, torch.arange(ranks, device=places.device).expand_as(places)
    )
    # Each rank goes to the first grid N above its place; s_c(N_k) is the running sum of those bins up to k
    # (one pass over y, where gathering y by place and summing it all the way would pass three times).
    bins = torch.searchsorted(chunk.grid.to(places.device).contiguous(), place_of_rank, right=True)
    d_head = y.shape[-1]
    binned = y.new_zeros(n_rows, ROLE_CONTROLS, len(chunk.grid) + 1, d_head).scatter_add_(
        2, bins.unsqueeze(-1).expand(-1, -1, -1, d_head), y.unsqueeze(1).expand(-1, ROLE_CONTROLS, -1, -1)
    )
    s_random = binned.cumsum(2)[:, :, : len(chunk.grid)]  # [row, control, n, d]: each control's s(N)
    single = chunk.n_visible < 2
    usable = ~chunk.missing & (chunk.grid < chunk.n_visible.unsqueeze(-1)) & ~single.unsqueeze(-1)
    sink_alone = (chunk.sink_rank() == 0).unsqueeze(-1) & (chunk.grid == 1)
    log_n = chunk.grid.to(p.dtype).log()
    for part, key in (("sink", sink), ("self", last)):
        v = chunk.value_of(key)
        chance = _cosine(s_random, v[:, None, None, :]).mean(1)
        raw = _cosine(chunk.s, v.unsqueeze(1))
        excess = raw - chance
        curve = excess.masked_fill(chunk.missing | single.unsqueeze(-1), math.nan)
        mean = torch.where(usable, excess, 0.0).sum(-1) / usable.sum(-1)
        slope = _slope(excess, log_n, usable & ~sink_alone)
        # The paper's curves as they are (not pinned to 0 at N = n): their mean and their slope against ln N over
        # the same N, the sink-alone point left out.
        raw_mean = torch.where(usable & ~sink_alone, raw, 0.0).sum(-1) / (usable & ~sink_alone).sum(-1)
        raw_slope = _slope(raw, log_n, usable & ~sink_alone)
        parts = {f"excess_cos_{part}": curve, f"align_{part}_excess": mean, f"shift_{part}": slope,
                 f"cos_{part}_raw": raw_mean, f"shift_{part}_raw": raw_slope}  # fmt: skip
        for name, t in parts.items():
            if part == "sink":
                t = t.masked_fill(~has_sink.view(-1, *([1] * (t.ndim - 1))), math.nan)
            out[name] = t if t.ndim > 1 else t.masked_fill(~defined, math.nan)
    return {name: t.masked_fill(single.view(-1, *([1] * (t.ndim - 1))), math.nan) for name, t in out.items()}


def _at_keys(
    by_rank: Float[Tensor, "row seen"], rank: Int[Tensor, "row key"], at: Int[Tensor, "row k"]
) -> Float[Tensor, "row k"]:
    """Values kept by rank (over the ranks some row sees) read at keys ``at`` through their ranks; a hidden key's
    rank, perhaps past those, is clamped (the caller masks it)."""
    return by_rank.gather(1, rank.gather(1, at).clamp(max=by_rank.shape[1] - 1))


def subtype_features(
    chunk: SelectionChunk, rest_of: RestKeys, total: Float[Tensor, "row d_head"], reach: int, early: int
) -> dict[str, Tensor]:
    """What a head's sub-type reads, per row: every lag 0..reach-1, and the early keys (module docstring).

    At lag k the key L - k: whether it is the row's top rest key, its
    attention weight and its output share <y_k, o> / ||o||^2; a lag the row
    cannot reach (before its first key, outside the window) holds no key: 0,
    so that the head's mean over rows is a share of all its rows. The early
    features are NaN for rows whose query is closer than 2 x early to the
    sink, or that do not see it. Rows with no rest keys are NaN throughout.
    """
    rows = torch.arange(chunk.n_rows, device=chunk.alpha.device)
    sink, last, has_sink = chunk.sink.clamp(min=0), chunk.last_key, chunk.has_sink
    keys = torch.arange(chunk.alpha.shape[-1], device=rows.device)
    is_rest, has_rest, top = rest_of.mask, rest_of.defined, rest_of.top
    o_sq = (total * total).sum(-1, keepdim=True)
    # Shares in selection order (y_sorted is there already) over the ranks some row sees, read at keys through
    # their ranks; a hidden key's rank (perhaps past them) is clamped, and its share masked below.
    ranks = chunk.seen_ranks()
    share_by_rank = torch.einsum("rkd,rd->rk", chunk.y_sorted[:, :ranks], total).div(o_sq)

    key = last.unsqueeze(-1) - torch.arange(reach, device=rows.device)
    inside = key >= 0
    at = key.clamp(min=0)
    inside &= chunk.visible.gather(1, at)
    out = {
        "top_rest_at_lag": ((key == top.unsqueeze(-1)) & inside).to(chunk.alpha.dtype),
        "attention_at_lag": chunk.alpha.gather(1, at).masked_fill(~inside, 0.0),
        "output_share_at_lag": _at_keys(share_by_rank, chunk.rank, at).masked_fill(~inside, 0.0),
    }
    position = keys - sink.unsqueeze(-1)
    is_early = is_rest & (position >= 1) & (position < early) & has_sink.unsqueeze(-1)
    strongest = chunk.alpha.masked_fill(~is_early, -1.0).max(-1)
    top_early = is_early.gather(1, top.unsqueeze(-1)).squeeze(-1)
    later = has_sink & (last - sink >= 2 * early) & is_early.any(-1)
    out["early_top_rest"] = top_early.to(chunk.alpha.dtype)
    out["early_position"] = (top - sink).to(chunk.alpha.dtype).masked_fill(~top_early, math.nan)
    out["early_attention"] = strongest.values
    early_key = strongest.indices.unsqueeze(-1)  # visible
    out["early_output_share"] = _at_keys(share_by_rank, chunk.rank, early_key).squeeze(-1)
    undefined = ~has_rest | (o_sq.squeeze(-1) <= 0)
    for name in EARLY_FEATURES:
        out[name] = out[name].masked_fill(~later, math.nan)
    return {name: t.masked_fill(undefined.view(-1, *([1] * (t.ndim - 1))), math.nan) for name, t in out.items()}


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
    reach: int = DEFAULT_REACH,
    early: int = DEFAULT_EARLY,
) -> dict[str, Tensor]:
    """The role features of independent query rows; the sink is each row's first visible key.

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
        for name, t in chunk_features(chunk, reach=reach, early=early).items():
            parts.setdefault(name, []).append(t)
    return {name: torch.cat(ts) for name, ts in parts.items()}


QuerySample = Literal["sample", "analysed"]


@dataclass(frozen=True)
class RoleSettings:
    """Settings of the roles diagnostic.

    Attributes:
        queries: ``"sample"`` (default): the features are measured on a seeded
            sample of ``n_queries`` query positions per sequence, one drawn
            uniformly in each of ``n_queries`` equal strata of the positions
            1..(the sequence's last analysed query), whatever
            ``query_positions`` the selection metrics use; ``"analysed"``: on
            the run's analysed queries (e.g. only the last one).
        n_queries: the sample's size per sequence (>= 1); fewer where a
            sequence has fewer positions.
        seed: the seed (in [0, 2^32)) of the sample and of the random
            rankings behind the alignment's chance level; the positions of a
            sequence depend only on it, the seed and the sequence's tokens.
        reach: the lags behind the query that a sub-type can name are
            0..reach-1 (>= 2; default 64: the induction lag T - 1 of the
            known-mechanism check's period 64).
        early: keys at positions 1..early-1 after the sink are early (a
            secondary sink is one of them), read on rows whose query is at
            least 2 x early past the sink (>= 2; default 16).
    """

    queries: str = "sample"
    n_queries: int = DEFAULT_QUERY_SAMPLE
    seed: int = 0
    reach: int = DEFAULT_REACH
    early: int = DEFAULT_EARLY

    def __post_init__(self) -> None:
        if self.queries not in get_args(QuerySample):
            raise GeometryError(
                f"settings['roles'].queries: expected one of {get_args(QuerySample)}, got {self.queries!r}"
            )
        if isinstance(self.n_queries, bool) or not isinstance(self.n_queries, int) or self.n_queries < 1:
            raise GeometryError(
                f"settings['roles'].n_queries: expected a positive integer (query positions sampled per "
                f"sequence), got {self.n_queries!r}"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**32:
            raise GeometryError(f"settings['roles'].seed: expected an integer in [0, 2^32), got {self.seed!r}")
        for name, what in (("reach", "the lags a sub-type can name"), ("early", "keys after the sink that are early")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 2:
                raise GeometryError(f"settings['roles'].{name}: expected an integer >= 2 ({what}), got {value!r}")


# The declarations, by name: ``result.per_head(SHARE_SINK)`` reads a field as ``result.per_head("share_sink")``.
S_NORM_WITHOUT_SINK = FieldSpec("s_norm_without_sink", "||s(N)|| with the sink left out of the top-N set", ("n",))
S_NORM_WITHOUT_LAST = FieldSpec("s_norm_without_last", "||s(N)|| with the query's own token left out of the top-N set", ("n",))  # fmt: skip
COS_S_SINK = FieldSpec("cos_s_sink", "cos(s(N), v_sink)", ("n",))
COS_S_LAST = FieldSpec("cos_s_last", "cos(s(N), v_L), L the query's own position", ("n",))
COS_S_SINK_MIXED = FieldSpec("cos_s_sink_mixed", "cos(s(N), v_sink), NaN where the top-N set is the sink alone", ("n",))
COS_S_LAST_MIXED = FieldSpec("cos_s_last_mixed", "cos(s(N), v_L), NaN where the top-N set is the sink alone", ("n",))
CONTRIBUTION_SINK = FieldSpec("contribution_sink", "||alpha_sink v_sink||")
CONTRIBUTION_LAST = FieldSpec("contribution_last", "||alpha_L v_L||")
CONTRIBUTION_REST = FieldSpec("contribution_rest", "||sum of alpha_i v_i over the other visible keys||")
ROLE_ATTENTION_SINK = FieldSpec("role_attention_sink", "attention weight on the sink")
ROLE_ATTENTION_LAST = FieldSpec("role_attention_last", "attention weight on the query's own token")
CONTRIBUTION_BY_POSITION = FieldSpec("contribution_by_position", "||alpha_i v_i|| by key position (last analysed query)", ("position",), queries="last", documents="mean")  # fmt: skip
COS_LAST_BY_POSITION = FieldSpec("cos_last_by_position", "cos(v_i, v_L) by key position (last analysed query)", ("position",), queries="last", documents="mean")  # fmt: skip
# The role rules' inputs: replicates by default, resampling documents and the query rows within them.
SHARE_SINK = FieldSpec("share_sink", "<y_sink, o> / ||o||^2: the sink's share of the head's output o", bootstrap=True, resample_queries=True)  # fmt: skip
SHARE_SELF = FieldSpec("share_self", "<y_L, o> / ||o||^2: the query's own token's share of o", bootstrap=True, resample_queries=True)  # fmt: skip
SHARE_REST = FieldSpec("share_rest", "the other visible keys' share of o (the three shares sum to 1)", bootstrap=True, resample_queries=True)  # fmt: skip
REST_EFFECTIVE_SHARE = FieldSpec("rest_effective_share", "effective number of rest keys (exp of the entropy of their weights) over their count", bootstrap=True, resample_queries=True)  # fmt: skip
TOP_REST_SHARE = FieldSpec("top_rest_share", "the top rest key's weight over the rest's total weight", bootstrap=True, resample_queries=True)  # fmt: skip
PREVIOUS_TOKEN = FieldSpec("previous_token", "1 where the top rest key is the previous token (lag 1), else 0", bootstrap=True, resample_queries=True)  # fmt: skip
ALIGN_SINK_EXCESS = FieldSpec("align_sink_excess", "mean over 1 <= N < n of cos(s(N), v_sink) minus its random-set expectation", bootstrap=True, resample_queries=True)  # fmt: skip
ALIGN_SELF_EXCESS = FieldSpec("align_self_excess", "mean over 1 <= N < n of cos(s(N), v_L) minus its random-set expectation", bootstrap=True, resample_queries=True)  # fmt: skip
SHIFT_SINK_RAW = FieldSpec("shift_sink_raw", "slope against ln N of cos(s(N), v_sink) (1 <= N < n, sink alone left out)", bootstrap=True, resample_queries=True)  # fmt: skip
SHIFT_SELF_RAW = FieldSpec("shift_self_raw", "slope against ln N of cos(s(N), v_L) (1 <= N < n, sink alone left out)", bootstrap=True, resample_queries=True)  # fmt: skip
SHIFT_SINK = FieldSpec("shift_sink", "slope against ln N of the excess of cos(s(N), v_sink) over random sets")
SHIFT_SELF = FieldSpec("shift_self", "slope against ln N of the excess of cos(s(N), v_L) over random sets")
CONTRIBUTION_TOP_REST = FieldSpec("contribution_top_rest", "the largest ||alpha_i v_i|| among the rest's keys (0 without rest keys)")  # fmt: skip
COS_SINK_RAW = FieldSpec("cos_sink_raw", "mean over 1 <= N < n of cos(s(N), v_sink), sink alone left out")
COS_SELF_RAW = FieldSpec("cos_self_raw", "mean over 1 <= N < n of cos(s(N), v_L), sink alone left out")
LOO_SINK = FieldSpec("loo_sink", "||o - y_sink|| / ||o|| (Figure 7, every key selected)")
LOO_SELF = FieldSpec("loo_self", "||o - y_L|| / ||o|| (Figure 7, every key selected)")
REST_EFFECTIVE_KEYS = FieldSpec("rest_effective_keys", "effective number of rest keys: exp of the entropy of their weights")  # fmt: skip
# Moments, not means: their spread over documents tells a sub-type near a floor (uncertain) from one past it.
TOP_REST_AT_LAG = FieldSpec("top_rest_at_lag", "share of all query rows whose top rest key is at each lag behind the query", ("lag",))  # fmt: skip
ATTENTION_AT_LAG = FieldSpec("attention_at_lag", "mean attention weight on the key at each lag (0 where a row cannot reach it)", ("lag",))  # fmt: skip
OUTPUT_SHARE_AT_LAG = FieldSpec("output_share_at_lag", "mean output share <y_k, o> / ||o||^2 of the key at each lag", ("lag",))  # fmt: skip
EARLY_TOP_REST = FieldSpec("early_top_rest", "1 where the top rest key is early (positions 1..early-1 after the sink), later rows")  # fmt: skip
EARLY_POSITION = FieldSpec("early_position", "the top rest key's position after the sink where it is early")
EARLY_ATTENTION = FieldSpec("early_attention", "the largest attention weight on an early key, later rows")
EARLY_OUTPUT_SHARE = FieldSpec("early_output_share", "the output share <y_k, o> / ||o||^2 of that early key")
EXCESS_COS_SINK = FieldSpec("excess_cos_sink", "cos(s(N), v_sink) minus its expectation over random N-subsets", ("n",))
EXCESS_COS_SELF = FieldSpec("excess_cos_self", "cos(s(N), v_L) minus its expectation over random N-subsets", ("n",))


class RoleDiagnostic(Diagnostic):
    name = "roles"
    former_names = ("taxonomy",)  # its name until the head-role feature took one word
    Settings = RoleSettings
    # Per row: the random rankings' places and bins (the alignment's chance level), key x control each.
    cost = RowCost(key_d=ROLE_CONTROLS)
    fields = (
        S_NORM_WITHOUT_SINK, S_NORM_WITHOUT_LAST, COS_S_SINK, COS_S_LAST, COS_S_SINK_MIXED, COS_S_LAST_MIXED,
        CONTRIBUTION_SINK, CONTRIBUTION_LAST, CONTRIBUTION_REST, ROLE_ATTENTION_SINK, ROLE_ATTENTION_LAST,
        CONTRIBUTION_BY_POSITION, COS_LAST_BY_POSITION, SHARE_SINK, SHARE_SELF, SHARE_REST, REST_EFFECTIVE_SHARE,
        TOP_REST_SHARE, PREVIOUS_TOKEN, ALIGN_SINK_EXCESS, ALIGN_SELF_EXCESS, SHIFT_SINK_RAW, SHIFT_SELF_RAW, LOO_SINK,
        LOO_SELF, REST_EFFECTIVE_KEYS, SHIFT_SINK, SHIFT_SELF, CONTRIBUTION_TOP_REST, COS_SINK_RAW, COS_SELF_RAW,
        EXCESS_COS_SINK, EXCESS_COS_SELF, TOP_REST_AT_LAG, ATTENTION_AT_LAG, OUTPUT_SHARE_AT_LAG, EARLY_TOP_REST,
        EARLY_POSITION, EARLY_ATTENTION, EARLY_OUTPUT_SHARE,
    )
    former_fields = {"taxonomy_attention_sink": ROLE_ATTENTION_SINK, "taxonomy_attention_last": ROLE_ATTENTION_LAST}

    def rows(self, chunk: SelectionChunk, settings: Any) -> dict[str, Tensor]:
        return chunk_features(chunk, settings.seed, settings.reach, settings.early)

    def sequences(self, context: SelectionContext, settings: Any) -> dict[str, Tensor]:
        """Figure 10's per-position features of each sequence's last query, in slices of sequences within the
        memory budget."""
        alpha, visible, _, _ = context.last_query()
        heads = alpha.shape[1]
        parts: dict[str, list[Tensor]] = {}
        for part in context.sequence_parts(position_features_bytes(heads, alpha.shape[-1], context.d_head,
                                                                   context.dtype)):
            # The values of every analysed head (a copy per query head under grouped-query attention): of this slice only.
            values = context.value_states[part][:, :, context.value_heads].to(context.dtype)
            batch = values.shape[0]
            by_position = position_features(
                einops.rearrange(alpha[part], "batch head key -> (batch head) key"),
                einops.rearrange(values, "batch key head d -> (batch head) key d"),
                einops.repeat(visible[part], "batch key -> (batch head) key", head=heads),
            )
            for name, t in by_position.items():
                shifted = context.from_first_real(einops.rearrange(t, "(batch head) key -> batch head key", batch=batch),
                                                  part)
                parts.setdefault(name, []).append(shifted)
        return {name: torch.cat(ts) for name, ts in parts.items()}


def position_features_bytes(n_heads: int, n_keys: int, d_head: int, dtype: torch.dtype) -> int:
    """Working memory of `position_features` per sequence, in bytes (an upper bound): the values of every
    analysed head, copied, rearranged and normalised for the cosines (up to 4 of ``[head, key, d_head]``);
    tests/test_diagnostics_memory.py measures it."""
    return 4 * max(4, dtype.itemsize) * n_heads * n_keys * d_head


DIAGNOSTIC = RoleDiagnostic()

__getattr__ = old_names(__name__, globals())  # the names they had before (tl_geometry._renamed)
