"""Retriever / Mixer / Reset: the paper's head taxonomy (section 4.2) as literal rules, and "unclassified".

Notation. For one query row, L is the query's own position (the last key
it sees; for the default ``query_positions="last"`` the sequence's last
token), the sink is the sequence's first real token, y_i = alpha_i v_i and
s(N) the sum of y_i over the top-N keys. The rules read five features of
`tl_geometry.diagnostics.taxonomy`, averaged over queries and documents:
c_0 = ||y_sink||, c_L = ||y_L||, c_R = ||sum of the other y_i||,
cos(s(N), v_L) and cos(s(N), v_0). The Mixer reads both cosines without the
N where the top-N set is the sink alone (written cos*): there s(N) is the
sink's own y_0, cos(s, v_0) = 1 and cos(s, v_L) = cos(v_0, v_L) by
construction, and a shift measured from there could not fail.

Ranges of N, over the grid points where cos(s, v_L) is defined: "early" is
N <= n_small, "late" is N >= late_fraction x (largest defined N), "below late"
the rest. A mean over an empty range is NaN.

Each rule is a conjunction of conditions, each condition a slack that is
positive when it holds; a rule's margin is its smallest slack:

Retriever ("last token dominates: ||alpha_L v_L|| is largest; s(N) stays
strongly aligned with v_L across N"):
    (c_L - max(c_0, c_R)) / (c_L + max(c_0, c_R))
    mean over every N of cos(s, v_L) - align_high
Mixer ("last token intermediate between sink and rest: alignment shifts from
v_0 at small N towards v_L as N increases"):
    min(c_L - min(c_0, c_R), max(c_0, c_R) - c_L) / (c_0 + c_R)
    [cos*(s, v_L)]_late - [cos*(s, v_L)]_early - shift_min          (rising)
    [cos*(s, v_0)]_early - [cos*(s, v_0)]_late - shift_min          (falling)
Reset ("||alpha_0 v_0|| comparable to or exceeds the others; weak cos(s, v_L)
except at very large N"):
    (c_0 - comparable x max(c_L, c_R)) / (c_0 + max(c_L, c_R))
    align_low - mean below late N of cos(s, v_L)

A rule is met when its margin exceeds ``min_margin``. The label is the one
rule met; otherwise the head is ``"unclassified"``, with a reason:
``"undefined"`` (some rule cannot be evaluated: NaN features, no early or no
late N on the grid, no visible sink), ``"weak"`` (no rule met) or
``"contradictory"`` (more than one met). Nothing undefined becomes a named
regime.
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from tl_geometry.config import GeometryConfig
from tl_geometry.errors import GeometryError
from tl_geometry.diagnostics.taxonomy import CURVE_FEATURES, TAXONOMY_FEATURES
from tl_geometry.capture.hooks import HookableModel, run_with_geometry_hooks
from tl_geometry.results.result import GeometryResult

Regime = Literal["retriever", "mixer", "reset", "unclassified"]
"""The name of a head regime; ``"unclassified"`` when the evidence does not decide."""
REGIMES: tuple[str, ...] = get_args(Regime)
"""The four outcomes, in label order: ``HeadTaxonomy.labels`` index into this tuple."""
NAMED: tuple[str, ...] = REGIMES[:-1]
"""The three regimes with a rule (retriever, mixer, reset)."""
UNCLASSIFIED = REGIMES.index("unclassified")
Reason = Literal["met", "undefined", "weak", "contradictory"]
REASONS: tuple[str, ...] = get_args(Reason)
"""Why a head has its label: ``HeadTaxonomy.reason`` index into this tuple."""
# The conditions of each rule, in NAMED order (names of `rule_conditions`' outputs).
CONDITIONS: dict[str, tuple[str, ...]] = {
    "retriever": ("last_largest", "last_aligned"),
    "mixer": ("last_between", "last_rising", "sink_falling"),
    "reset": ("sink_comparable", "last_weak"),
}
# The per-head values the rules read; a label's confidence needs their replicates (see `with_regime_replicates`).
REGIME_INPUTS: tuple[str, ...] = (
    "contribution_sink", "contribution_last", "contribution_rest", "cos_s_last", "cos_s_sink_mixed", "cos_s_last_mixed",
)  # fmt: skip
EPS = 1e-12
# The thresholds `threshold_sensitivity` moves by +-10 %.
THRESHOLDS: tuple[str, ...] = ("align_high", "align_low", "shift_min", "comparable", "late_fraction", "n_small")


@dataclass(frozen=True)
class TaxonomyConfig:
    """Thresholds of the taxonomy rules (see the module docstring).

    Attributes:
        n_small: "early" N are N <= n_small (the paper's small-N regime, N in [1, 4]).
        late_fraction: "late" N are N >= late_fraction times the largest N
            defined for the head; in (0, 1].
        align_high: Retriever: the mean cos(s, v_L) over N must exceed it.
        align_low: Reset: the mean cos(s, v_L) below late N must stay under it.
        shift_min: Mixer: cos(s, v_L) must rise, and cos(s, v_0) fall, by
            more than this between early and late N.
        comparable: Reset: c_0 must reach ``comparable`` times both c_L and
            c_R ("comparable to or exceeds"); in (0, 1].
        min_margin: a rule is met when its margin exceeds this (>= 0).
        min_confidence: labels whose bootstrap confidence is below this are
            flagged ``low_confidence``; in [0, 1].

    >>> TaxonomyConfig(align_high=2.0)
    Traceback (most recent call last):
    ...
    tl_geometry.errors.GeometryError: align_high: expected a number in [-1, 1] (a cosine), got 2.0
    """

    n_small: int = 4
    late_fraction: float = 0.25
    align_high: float = 0.5
    align_low: float = 0.3
    shift_min: float = 0.05
    comparable: float = 0.8
    min_margin: float = 0.0
    min_confidence: float = 0.8

    def __post_init__(self) -> None:
        if isinstance(self.n_small, bool) or not isinstance(self.n_small, int) or self.n_small < 1:
            raise GeometryError(f"n_small: expected an integer >= 1, got {self.n_small!r}")
        names = ("late_fraction", "align_high", "align_low", "shift_min", "comparable", "min_margin", "min_confidence")
        for name in names:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise GeometryError(f"{name}: expected a finite number, got {value!r}")
        ranges = {
            "late_fraction": (0, 1, "a number in (0, 1]", False),
            "comparable": (0, 1, "a number in (0, 1]", False),
            "align_high": (-1, 1, "a number in [-1, 1] (a cosine)", True),
            "align_low": (-1, 1, "a number in [-1, 1] (a cosine)", True),
            "min_confidence": (0, 1, "a number in [0, 1]", True),
        }
        for name, (low, high, text, closed) in ranges.items():
            value = getattr(self, name)
            if not (low <= value <= high if closed else low < value <= high):
                raise GeometryError(f"{name}: expected {text}, got {value!r}")
        for name in ("shift_min", "min_margin"):
            if getattr(self, name) < 0:
                raise GeometryError(f"{name}: expected a number >= 0, got {getattr(self, name)!r}")


def _masked_mean(x: Float[Tensor, "*batch n"], mask: Bool[Tensor, "*batch n"]) -> Float[Tensor, "*batch"]:
    """Mean of x over the grid points in mask (NaN where mask is empty)."""
    count = mask.sum(-1)
    total = torch.where(mask, x, torch.zeros((), dtype=x.dtype)).sum(-1)
    return torch.where(count > 0, total / count.clamp(min=1), torch.full((), math.nan, dtype=x.dtype))


def rule_conditions(
    features: Mapping[str, Tensor], grid: Int[Tensor, " n"], config: TaxonomyConfig
) -> dict[str, Tensor]:
    """The slack of every condition of every rule: positive where it holds, NaN where undefined.

    Args:
        features: ``REGIME_INPUTS``: the curves ``[*batch, n]`` and the
            contributions ``[*batch]`` (per head, per bootstrap replicate and
            head, or per query row).
        grid: the selection sizes N of the curves.
        config: the thresholds.

    Returns:
        Every name of ``CONDITIONS`` -> ``[*batch]``.
    """
    f = {name: features[name].double() for name in REGIME_INPUTS}
    c0, cl, cr = f["contribution_sink"], f["contribution_last"], f["contribution_rest"]
    cos_last, cos_sink, cos_last_mixed = f["cos_s_last"], f["cos_s_sink_mixed"], f["cos_s_last_mixed"]
    grid = grid.to(cos_last.device).double()
    valid = ~torch.isnan(cos_last)
    n_max = torch.where(valid, grid, torch.zeros((), dtype=grid.dtype)).amax(-1, keepdim=True)
    early, late = grid <= config.n_small, grid >= config.late_fraction * n_max
    sink_valid, mixed_valid = ~torch.isnan(cos_sink), ~torch.isnan(cos_last_mixed)
    lo, hi = torch.minimum(c0, cr), torch.maximum(c0, cr)
    others_last = torch.maximum(cl, cr)
    rising = _masked_mean(cos_last_mixed, mixed_valid & late) - _masked_mean(cos_last_mixed, mixed_valid & early)
    falling = _masked_mean(cos_sink, sink_valid & early) - _masked_mean(cos_sink, sink_valid & late)
    return {
        "last_largest": (cl - hi) / (cl + hi + EPS),
        "last_aligned": _masked_mean(cos_last, valid) - config.align_high,
        "last_between": torch.minimum(cl - lo, hi - cl) / (c0 + cr + EPS),
        "last_rising": rising - config.shift_min,
        "sink_falling": falling - config.shift_min,
        "sink_comparable": (c0 - config.comparable * others_last) / (c0 + others_last + EPS),
        "last_weak": config.align_low - _masked_mean(cos_last, valid & ~late),
    }


def rule_margins(conditions: Mapping[str, Tensor]) -> Float[Tensor, "*batch 3"]:
    """Each rule's margin (its smallest slack; NaN if any is undefined), ``[*batch, 3]`` in NAMED order."""
    margins = []
    for regime in NAMED:
        stacked = torch.stack([conditions[name] for name in CONDITIONS[regime]], dim=-1)
        # amin propagates NaN: one undefined condition leaves the rule undefined.
        margins.append(stacked.amin(-1))
    return torch.stack(margins, dim=-1)


def labels_from_margins(
    margins: Float[Tensor, "*batch 3"], min_margin: float = 0.0
) -> tuple[Int[Tensor, "*batch"], Int[Tensor, "*batch"]]:
    """The label (index into REGIMES) and the reason (index into REASONS) of every head.

    The one rule whose margin exceeds ``min_margin`` gives the label; a NaN
    margin, no rule met or several met give ``"unclassified"``.

    >>> labels, reasons = labels_from_margins(torch.tensor([[0.2, -0.1, -0.3], [0.2, 0.1, -1.0], [0.5, float("nan"), 0.0]]))
    >>> [REGIMES[i] for i in labels.tolist()], [REASONS[i] for i in reasons.tolist()]
    (['retriever', 'unclassified', 'unclassified'], ['met', 'contradictory', 'undefined'])
    """
    undefined = margins.isnan().any(-1)
    met = margins > min_margin
    n_met = met.sum(-1)
    labels = torch.where(n_met == 1, met.long().argmax(-1), UNCLASSIFIED)
    labels = torch.where(undefined, UNCLASSIFIED, labels)
    reasons = torch.where(n_met == 1, 0, torch.where(n_met == 0, REASONS.index("weak"), REASONS.index("contradictory")))
    reasons = torch.where(undefined, REASONS.index("undefined"), reasons)
    return labels, reasons


def _labels(features: Mapping[str, Tensor], grid: Tensor, config: TaxonomyConfig) -> tuple[dict[str, Tensor], Tensor, Tensor, Tensor]:
    conditions = rule_conditions(features, grid, config)
    margins = rule_margins(conditions)
    labels, reasons = labels_from_margins(margins, config.min_margin)
    return conditions, margins, labels, reasons


@dataclass(frozen=True)
class HeadTaxonomy:
    """Regime labels of every analysed head, with the evidence behind them.

    Attributes:
        labels: index into ``REGIMES`` per head, ``[layer, head_index]``.
        reason: index into ``REASONS`` per head (``"met"`` for a named
            regime; ``"undefined"``, ``"weak"`` or ``"contradictory"`` for
            ``"unclassified"``), ``[layer, head_index]``.
        scores: each rule's margin (its smallest slack; > ``min_margin``
            when met, NaN when undefined), ``[layer, head_index, 3]`` in
            ``NAMED`` order.
        margin: the largest of the three rule margins, ``[layer, head_index]``.
        confidence: the share of document-bootstrap replicates whose own
            feature means give the same label (``"unclassified"`` included),
            ``[layer, head_index]``; replicates that draw no document are left
            out. NaN where the result keeps no replicates of ``REGIME_INPUTS``
            (``n_bootstrap=0``).
        low_confidence: confidence below ``config.min_confidence``
            (False where the confidence is NaN), ``[layer, head_index]``.
        conditions: the slack of every condition, name -> ``[layer, head_index]``.
        features: the taxonomy features averaged over sequences, name ->
            ``[layer, head_index, ...]``.
        precision, recall: the selection metrics, ``[layer, head_index, n]``.
        n_grid: the selection sizes N, ``[n]``.
        layers, heads: the analysed layers and heads (axes of every tensor).
        config: the TaxonomyConfig used.
    """

    labels: Int[Tensor, "layer head_index"]
    reason: Int[Tensor, "layer head_index"]
    scores: Float[Tensor, "layer head_index 3"]
    margin: Float[Tensor, "layer head_index"]
    confidence: Float[Tensor, "layer head_index"]
    low_confidence: Bool[Tensor, "layer head_index"]
    conditions: Mapping[str, Tensor]
    features: Mapping[str, Tensor]
    precision: Float[Tensor, "layer head_index n"]
    recall: Float[Tensor, "layer head_index n"]
    n_grid: Int[Tensor, " n"]
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    config: TaxonomyConfig = field(default_factory=TaxonomyConfig)

    def label_names(self) -> list[list[str]]:
        """The labels as regime names, ``[layer][head_index]``."""
        return [[REGIMES[i] for i in row] for row in self.labels.tolist()]

    def counts_by_layer(self) -> Int[Tensor, "layer 4"]:
        """Heads of each outcome per layer (Figure 8), columns in REGIMES order (unclassified last)."""
        return torch.nn.functional.one_hot(self.labels, len(REGIMES)).sum(1)

    def table(self) -> list[dict[str, Any]]:
        """One row per head: layer, head, label, reason, margin, confidence, low_confidence."""
        rows = []
        for i, layer in enumerate(self.layers):
            for j, head in enumerate(self.heads):
                rows.append({
                    "layer": layer, "head": head, "label": REGIMES[int(self.labels[i, j])],
                    "reason": REASONS[int(self.reason[i, j])], "margin": float(self.margin[i, j]),
                    "confidence": float(self.confidence[i, j]), "low_confidence": bool(self.low_confidence[i, j]),
                })  # fmt: skip
        return rows

    def curves_by_regime(self, name: str = "precision") -> Float[Tensor, "4 n"]:
        """Mean curve over the heads of each outcome (Figure 11), NaN for an empty one.

        Args:
            name: ``"precision"``, ``"recall"`` or a curve feature (e.g. ``"cos_s_last"``).
        """
        if name in ("precision", "recall"):
            curve = getattr(self, name)
        elif name in CURVE_FEATURES or name == "s_norm":
            curve = self.features[name]
        else:
            raise GeometryError(f"name: expected 'precision', 'recall' or one of {CURVE_FEATURES}, got {name!r}")
        member = torch.nn.functional.one_hot(self.labels, len(REGIMES)).bool()  # [layer, head, 4]
        masked = torch.where(member.unsqueeze(-1), curve.unsqueeze(-2), torch.full((), math.nan, dtype=curve.dtype))
        return torch.nanmean(masked.flatten(0, 1), dim=0)

    def example_heads(self) -> dict[str, tuple[int, int] | None]:
        """Per outcome, the (layer, head) with that label and the largest margin (None if none).

        For ``"unclassified"``: the one whose best rule came closest (undefined heads last).
        """
        out: dict[str, tuple[int, int] | None] = {}
        for index, regime in enumerate(REGIMES):
            margin = self.scores[..., index] if index < len(NAMED) else self.margin
            score = torch.where(self.labels == index, torch.nan_to_num(margin.double(), nan=-1e9), -math.inf)
            flat = int(score.argmax())
            row, col = divmod(flat, score.shape[1])
            out[regime] = (self.layers[row], self.heads[col]) if bool(self.labels[row, col] == index) else None
        return out

    def contributions_by_regime(self) -> dict[str, Float[Tensor, " key"] | None]:
        """||alpha_i v_i|| by key position of each outcome's example head (Figure 10), None if it is empty."""
        out: dict[str, Tensor | None] = {}
        for regime, where in self.example_heads().items():
            if where is None:
                out[regime] = None
            else:
                layer, head = self.layers.index(where[0]), self.heads.index(where[1])
                out[regime] = self.features["contribution_by_position"][layer, head]
        return out


def _confidence(result: GeometryResult, labels: Tensor, config: TaxonomyConfig) -> Float[Tensor, "layer head_index"]:
    """The share of bootstrap replicates whose label equals ``labels``; NaN without replicates."""
    if not all(result.has_replicates(name) for name in REGIME_INPUTS):
        return torch.full(labels.shape, math.nan, dtype=torch.float64)
    replicates = {name: result.replicates(name) for name in REGIME_INPUTS}  # [replicate, layer, head, ...]
    replicate_labels = _labels(replicates, result.n_grid, config)[2]
    # A replicate whose weights leave no document of a head has no features there: no vote, not "undefined".
    drawn = ~torch.stack([replicates[name].reshape(*replicates[name].shape[:3], -1).isnan().all(-1) for name in REGIME_INPUTS]).all(0)
    agree = (replicate_labels == labels) & drawn
    return agree.sum(0).double() / drawn.sum(0).double()  # NaN where no replicate draws a document


def taxonomy_from_result(result: GeometryResult, config: TaxonomyConfig | None = None) -> HeadTaxonomy:
    """Classify the heads of a result computed with the ``"taxonomy"`` diagnostic."""
    config = config or TaxonomyConfig()
    missing = [name for name in TAXONOMY_FEATURES if name not in result.fields]
    if missing:
        raise GeometryError(
            f"result_or_model: the GeometryResult lacks the taxonomy features {missing}; run it with "
            "diagnostics=['taxonomy'] (e.g. run_with_geometry_hooks(model, tokens, diagnostics=['taxonomy'])) "
            "or pass the model and tokens to classify_heads"
        )
    per_head = {name: result.per_head(name) for name in (*TAXONOMY_FEATURES, "s_norm")}
    conditions, margins, labels, reasons = _labels(per_head, result.n_grid, config)
    confidence = _confidence(result, labels, config)
    return HeadTaxonomy(
        labels=labels,
        reason=reasons,
        scores=margins.float(),
        margin=margins.amax(-1).float(),  # NaN where some rule is undefined
        confidence=confidence.float(),
        low_confidence=confidence < config.min_confidence,
        conditions={name: t.float() for name, t in conditions.items()},
        features=per_head,
        precision=result.per_head("precision"),
        recall=result.per_head("recall"),
        n_grid=result.n_grid,
        layers=tuple(result.layers),
        heads=tuple(result.heads),
        config=config,
    )


@dataclass(frozen=True)
class SensitivityRow:
    """How many labels change when one threshold moves.

    Attributes:
        threshold: the TaxonomyConfig field moved.
        value: its moved value (the default times 0.9 or 1.1; n_small moves by 1).
        changed: heads whose label differs from the labels at the defaults.
        counts: heads per outcome at the moved value, in REGIMES order.
    """

    threshold: str
    value: float
    changed: int
    counts: tuple[int, ...]


def threshold_sensitivity(
    result: GeometryResult, config: TaxonomyConfig | None = None, step: float = 0.1
) -> list[SensitivityRow]:
    """Labels changed when each threshold of ``THRESHOLDS`` moves by -step and +step (relative).

    ``n_small`` is an integer: 10 % of 4 rounds to no change, so it moves by
    -1 and +1. A moved value outside the threshold's allowed range is clipped
    to the range (e.g. late_fraction and comparable stay <= 1).

    Args:
        result: a result with the taxonomy features.
        config: the thresholds to move from (default ``TaxonomyConfig()``).
        step: the relative move, in (0, 1).

    Returns:
        Two rows per threshold (down, then up), plus none for the defaults.
    """
    if isinstance(step, bool) or not isinstance(step, (int, float)) or not 0 < step < 1:
        raise GeometryError(f"step: expected a relative move in (0, 1), e.g. 0.1, got {step!r}")
    config = config or TaxonomyConfig()
    base = taxonomy_from_result(result, config).labels
    per_head = {name: result.per_head(name) for name in REGIME_INPUTS}
    rows = []
    for name in THRESHOLDS:
        value = getattr(config, name)
        if name == "n_small":
            moved_values: Sequence[float] = (max(1, value - 1), value + 1)
        else:
            moved_values = tuple(value * (1 + sign * step) for sign in (-1, 1))
            if name in ("late_fraction", "comparable"):
                moved_values = tuple(min(v, 1.0) for v in moved_values)
            if name in ("align_high", "align_low"):
                moved_values = tuple(max(-1.0, min(v, 1.0)) for v in moved_values)
        for moved in moved_values:
            labels = _labels(per_head, result.n_grid, replace(config, **{name: moved}))[2]
            counts = torch.bincount(labels.flatten(), minlength=len(REGIMES))
            rows.append(SensitivityRow(name, float(moved), int((labels != base).sum()), tuple(counts.tolist())))
    return rows


@dataclass(frozen=True)
class QueryTaxonomy:
    """Labels of every head at every kept query position of every prompt (``keep_queries=True``).

    Attributes:
        labels: index into ``REGIMES``, ``[doc, layer, head_index, query]``;
            ``"unclassified"`` at padded queries.
        reason: index into ``REASONS``, same shape.
        scores: each rule's margin, ``[doc, layer, head_index, query, 3]``.
        query_positions: the position of each query counted from the
            sequence's first real token, ``[doc, query]`` (-1 where a prompt
            has fewer queries).
        layers, heads: the analysed layers and heads.
        config: the TaxonomyConfig used.
    """

    labels: Int[Tensor, "doc layer head_index query"]
    reason: Int[Tensor, "doc layer head_index query"]
    scores: Float[Tensor, "doc layer head_index query 3"]
    query_positions: Int[Tensor, "doc query"]
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    config: TaxonomyConfig

    def at(self, doc: int, position: int) -> list[list[str]]:
        """The label names of every head for one prompt's query at ``position``, ``[layer][head_index]``."""
        where = (self.query_positions[doc] == position).nonzero().flatten()
        if len(where) == 0:
            kept = [p for p in self.query_positions[doc].tolist() if p >= 0]
            raise GeometryError(
                f"position: document {doc} kept no query at position {position}; its kept positions are {kept} "
                "(analyse with query_positions including it)"
            )
        labels = self.labels[doc, :, :, int(where[0])]
        return [[REGIMES[i] for i in row] for row in labels.tolist()]


def classify_queries(result: GeometryResult, config: TaxonomyConfig | None = None) -> QueryTaxonomy:
    """Label every head at every kept query position of every prompt, each query on its own.

    The rules are those of `classify_heads`, applied to one query row's
    features instead of the means over queries and documents: the variant for
    circuit studies where the interesting position (e.g. the IO name in IOI)
    differs from prompt to prompt. A single row has no bootstrap, so these
    labels carry no confidence: read them as a description of that forward
    pass, and prefer `classify_heads` over many prompts for a head's role.

    Args:
        result: a result analysed with ``diagnostics=["taxonomy"]`` and
            ``keep_queries=True`` (and the ``query_positions`` of interest,
            e.g. ``"all"`` or a list).
        config: the thresholds (default ``TaxonomyConfig()``).

    Returns:
        QueryTaxonomy, labels ``[doc, layer, head_index, query]``.
    """
    config = config or TaxonomyConfig()
    if result.queries is None or result.query_positions is None:
        raise GeometryError(
            "result: keeps no per-query rows; analyse with keep_queries=True and diagnostics=['taxonomy'], e.g. "
            "run_with_geometry_hooks(model, prompts, diagnostics=['taxonomy'], keep_queries=True, query_positions='all')"
        )
    missing = [name for name in REGIME_INPUTS if name not in result.queries]
    if missing:
        raise GeometryError(f"result: its per-query rows lack the taxonomy features {missing}; analyse with diagnostics=['taxonomy']")
    rows = {name: result.queries[name] for name in REGIME_INPUTS}  # [doc, layer, head, query, *trailing]
    _, margins, labels, reasons = _labels(rows, result.n_grid, config)
    return QueryTaxonomy(
        labels=labels, reason=reasons, scores=margins.float(), query_positions=result.query_positions,
        layers=tuple(result.layers), heads=tuple(result.heads), config=config,
    )  # fmt: skip


def _with_taxonomy(config: GeometryConfig | None) -> GeometryConfig:
    """The run's config with the taxonomy diagnostic, keeping replicates of the rules' inputs (for confidence)."""
    if config is None:
        config = GeometryConfig(diagnostics=("taxonomy",))
    if not isinstance(config, GeometryConfig):
        raise GeometryError(f"config: expected a GeometryConfig or None, got {type(config).__name__}")
    if "taxonomy" not in config.diagnostics:
        config = config.with_overrides(diagnostics=(*config.diagnostics, "taxonomy"))
    return with_regime_replicates(config)


def with_regime_replicates(config: GeometryConfig) -> GeometryConfig:
    """``config`` also keeping bootstrap replicates of ``REGIME_INPUTS``, so that labels get a confidence.

    >>> from tl_geometry import GeometryConfig
    >>> "cos_s_last" in with_regime_replicates(GeometryConfig(diagnostics=["taxonomy"])).bootstrap_fields
    True
    """
    from tl_geometry.capture.hooks import active_diagnostics

    if config.bootstrap_fields is None:
        declared = [spec.name for d in active_diagnostics(config) for spec in d.fields if spec.bootstrap]
    else:
        declared = list(config.bootstrap_fields)
    return config.with_overrides(bootstrap_fields=(*declared, *REGIME_INPUTS))


def classify_heads(
    result_or_model: Any, tokens: Any = None, config: GeometryConfig | None = None, *, taxonomy: Any = None
) -> HeadTaxonomy:
    """Label every analysed head Retriever, Mixer, Reset or unclassified, with the evidence behind it.

    Args:
        result_or_model: a GeometryResult computed with ``diagnostics`` including
            ``"taxonomy"``, or a TransformerLens model (then ``tokens`` is required).
        tokens: for a model: token ids ``[batch, pos]``, a string or a list of strings.
        config: for a model: the GeometryConfig of the run (``"taxonomy"`` is
            added to its diagnostics).
        taxonomy: the TaxonomyConfig (thresholds); default ``TaxonomyConfig()``.

    Returns:
        HeadTaxonomy with ``labels`` ``[layer, head_index]`` indexing ``REGIMES``
        and the bootstrap ``confidence`` of each label: a run on a model keeps
        the replicates it needs; a result has them if it was computed with
        ``with_regime_replicates(config)`` (else, or with ``n_bootstrap=0``, NaN).

    Raises:
        GeometryError: a result without the taxonomy features, a model without
            tokens, tokens or config given with a result, or any bad input.
    """
    if taxonomy is not None and not isinstance(taxonomy, TaxonomyConfig):
        raise GeometryError(f"taxonomy: expected a TaxonomyConfig or None, got {type(taxonomy).__name__}")
    if isinstance(result_or_model, GeometryResult):
        if tokens is not None or config is not None:
            raise GeometryError(
                "tokens/config: only used with a model; the GeometryResult is already computed, call "
                "classify_heads(result) alone"
            )
        return taxonomy_from_result(result_or_model, taxonomy)
    if isinstance(result_or_model, HookableModel):
        if tokens is None:
            raise GeometryError(
                "tokens: required when classify_heads gets a model; pass text or token ids, "
                "e.g. classify_heads(model, 'some text')"
            )
        result = run_with_geometry_hooks(result_or_model, tokens, config=_with_taxonomy(config))
        return taxonomy_from_result(result, taxonomy)
    raise GeometryError(
        f"result_or_model: expected a GeometryResult or a TransformerLens model, got {type(result_or_model).__name__}"
    )


def detect_regime(
    model: Any,
    seq: Any,
    regime: str,
    heads: list[tuple[int, int]] | dict[int, list[int]] | None = None,
    *,
    config: GeometryConfig | None = None,
    taxonomy: TaxonomyConfig | None = None,
) -> Float[Tensor, "n_layers n_heads"]:
    """Every head's margin for one regime's rule, shaped like ``transformer_lens.head_detector.detect_head``.

    Args:
        model: a TransformerLens model.
        seq: a string, a list of strings (scored on the features averaged over
            them, where ``detect_head`` averages the scores) or token ids.
        regime: one of ``NAMED`` (retriever, mixer, reset).
        heads: as in ``detect_head``: a list of (layer, head) or a dict
            layer -> heads; other heads are NaN. Default: every head.
        config: the GeometryConfig of the run.
        taxonomy: the TaxonomyConfig.

    Returns:
        The rule's margin per head, ``[n_layers, n_heads]``: > 0 (the default
        ``min_margin``) where the rule holds, NaN where it cannot be
        evaluated and for heads not asked for. A head can meet a rule and
        still be unclassified (another rule holds too): `classify_heads`
        gives the labels.

    Raises:
        GeometryError: unknown regime, bad heads or any bad input of classify_heads.
    """
    if regime not in NAMED:
        raise GeometryError(f"regime: expected one of {NAMED}, got {regime!r}")
    if not isinstance(model, HookableModel):
        raise GeometryError(f"model: expected a TransformerLens model, got {type(model).__name__}")
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    if heads is None:
        pairs = [(layer, head) for layer in range(n_layers) for head in range(n_heads)]
    elif isinstance(heads, dict):
        pairs = [(int(layer), int(head)) for layer, hs in heads.items() for head in hs]
    elif isinstance(heads, list):
        pairs = [(int(layer), int(head)) for layer, head in heads]
    else:
        raise GeometryError(f"heads: expected a list of (layer, head), a dict layer -> heads or None, got {heads!r}")
    if not pairs:
        raise GeometryError("heads: got no heads; pass None for every head")
    overrides = {"layers": sorted({p[0] for p in pairs}), "heads": sorted({p[1] for p in pairs})}
    base = _with_taxonomy(config).with_overrides(**overrides)
    found = classify_heads(model, seq, base, taxonomy=taxonomy)
    scores = torch.full((n_layers, n_heads), math.nan)
    index = NAMED.index(regime)
    layer_at = torch.tensor([found.layers.index(layer) for layer, _ in pairs])
    head_at = torch.tensor([found.heads.index(head) for _, head in pairs])
    wanted = torch.tensor(pairs)
    scores[wanted[:, 0], wanted[:, 1]] = found.scores[layer_at, head_at, index]
    return scores
