"""Retriever / Mixer / Reset: the paper's head taxonomy (section 4.2) as explicit rules.

The paper's criteria are qualitative; here each regime gets three sub-scores
in [0, 1], computed from the features of `tl_geometry.diagnostics.taxonomy`
(c_0 = ||alpha_0 v_0||, c_L = ||alpha_L v_L||, c_R = ||sum of the other
alpha_i v_i||, and the curves over N), and the regime's score is their mean
(or geometric mean). The label is the regime with the largest score; exact ties
go to the first regime in ``REGIMES`` order (retriever, mixer, reset).

Ranges of N (grid points where the curve is defined): "early" is N <= n_small,
"late" is N >= late_fraction * (largest defined N), "below late" the rest
(early if that is empty). Means over a range are plain means over its grid
points. eps = 1e-12 guards every ratio.

Retriever ("last token dominates, s(N) aligned with v_L across N, sharp drop
when removing L"):
    last_dominance   min(1, c_L / max(c_0, c_R))
    last_alignment   mean over all N of max(cos(s, v_L), 0)
    last_removal     mean over all N of clip((||s|| - ||s without L||) / ||s||, 0, 1)
Mixer ("last token between sink and rest, alignment shifts from v_0 to v_L as
N grows, leave-one-out norms converge"):
    last_between     min(1, c_L / min(c_0, c_R), max(c_0, c_R) / c_L)
    alignment_shift  clip(([cos_L]_late - [cos_L]_early + [cos_0]_early - [cos_0]_late) / (2 shift_full), 0, 1)
    loo_convergence  mean over late N of clip(1 - | ||s without 0|| - ||s without L|| | / ||s||, 0, 1)
Reset ("c_0 comparable to or above the others, weak cos(s, v_L) except at very
large N, removing the sink reduces ||s(N)|| more than removing L"):
    sink_weight      min(1, c_0 / c_L)
    weak_last        1 - mean over N below late of max(cos(s, v_L), 0)
    sink_removal     clip(1/2 + (drop_0 - drop_L) / 2, 0, 1), drop_x the mean relative drop of ||s||
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tl_geometry.config import GeometryConfig
from tl_geometry.errors import GeometryError
from tl_geometry.diagnostics.taxonomy import CURVE_FEATURES, SCALAR_FEATURES, TAXONOMY_FEATURES
from tl_geometry.capture.hooks import HookableModel, run_with_geometry_hooks
from tl_geometry.results.result import GeometryResult

Regime = Literal["retriever", "mixer", "reset"]
"""The name of a head regime."""
REGIMES: tuple[str, ...] = get_args(Regime)
"""The three regimes, in label order: ``HeadTaxonomy.labels`` index into this tuple."""
Combine = Literal["mean", "geometric"]
# The sub-scores behind each regime's score, in REGIMES order.
CRITERIA: dict[str, tuple[str, str, str]] = {
    "retriever": ("last_dominance", "last_alignment", "last_removal"),
    "mixer": ("last_between", "alignment_shift", "loo_convergence"),
    "reset": ("sink_weight", "weak_last", "sink_removal"),
}
EPS = 1e-12
# The per-head values the rules read: ||s(N)|| (a selection metric) and the taxonomy diagnostic's features.
REGIME_INPUTS: tuple[str, ...] = ("s_norm", *CURVE_FEATURES, *SCALAR_FEATURES)


@dataclass(frozen=True)
class TaxonomyConfig:
    """Thresholds of the taxonomy rules (see the module docstring).

    Attributes:
        n_small: "early" N are N <= n_small (the paper's small-N regime, N in [1, 4]).
        late_fraction: "late" N are N >= late_fraction times the largest N
            defined for the head; in (0, 1].
        shift_full: the mean rise of cos(s, v_L) and fall of cos(s, v_0)
            between early and late N that gives a full alignment_shift of 1.
        combine: how a regime's three sub-scores become its score, ``"mean"``
            or ``"geometric"`` (every criterion must hold).

    >>> TaxonomyConfig(combine="max")
    Traceback (most recent call last):
    ...
    tl_geometry.errors.GeometryError: combine: expected one of ('mean', 'geometric'), got 'max'
    """

    n_small: int = 4
    late_fraction: float = 0.25
    shift_full: float = 0.25
    combine: str = "mean"

    def __post_init__(self) -> None:
        if isinstance(self.n_small, bool) or not isinstance(self.n_small, int) or self.n_small < 1:
            raise GeometryError(f"n_small: expected an integer >= 1, got {self.n_small!r}")
        for name in ("late_fraction", "shift_full"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise GeometryError(f"{name}: expected a finite number, got {value!r}")
        if not 0 < self.late_fraction <= 1:
            raise GeometryError(f"late_fraction: expected a number in (0, 1], got {self.late_fraction!r}")
        if not self.shift_full > 0:
            raise GeometryError(f"shift_full: expected a number > 0, got {self.shift_full!r}")
        if self.combine not in get_args(Combine):
            raise GeometryError(f"combine: expected one of {get_args(Combine)}, got {self.combine!r}")


def _masked_mean(x: Float[Tensor, "*batch n"], mask: Tensor) -> Float[Tensor, "*batch"]:
    """Mean of x over the grid points in mask (NaN where mask is empty)."""
    count = mask.sum(-1)
    total = torch.where(mask, x, torch.zeros((), dtype=x.dtype)).sum(-1)
    return torch.where(count > 0, total / count.clamp(min=1), torch.full((), math.nan, dtype=x.dtype))


def regime_criteria(
    features: Mapping[str, Tensor], grid: Int[Tensor, " n"], config: TaxonomyConfig
) -> dict[str, Tensor]:
    """The nine sub-scores in [0, 1] of every head (and sequence), from its features.

    Args:
        features: ``REGIME_INPUTS``: the curves (``s_norm`` and ``CURVE_FEATURES``)
            ``[*batch, n]`` and ``SCALAR_FEATURES`` ``[*batch]`` (per head, or
            per bootstrap replicate and head).
        grid: the selection sizes N of the curves.
        config: the thresholds.

    Returns:
        Every name of ``CRITERIA`` -> ``[*batch]``; NaN where a head has no
        defined N.
    """
    f = {name: features[name].double() for name in REGIME_INPUTS}
    c0, cl, cr = f["contribution_sink"], f["contribution_last"], f["contribution_rest"]
    cos_last, cos_sink, s = f["cos_s_last"], f["cos_s_sink"], f["s_norm"]
    grid = grid.to(cos_last.device).double()
    valid = ~torch.isnan(cos_last)
    n_max = torch.where(valid, grid, torch.zeros((), dtype=grid.dtype)).amax(-1, keepdim=True)
    early = valid & (grid <= config.n_small)
    late = valid & (grid >= config.late_fraction * n_max)
    below = valid & ~late
    below = torch.where(below.any(-1, keepdim=True), below, early)
    drop_last = ((s - f["s_norm_without_last"]) / (s + EPS)).clamp(0, 1)
    drop_sink = ((s - f["s_norm_without_sink"]) / (s + EPS)).clamp(0, 1)
    aligned = cos_last.clamp(min=0)
    lo, hi = torch.minimum(c0, cr), torch.maximum(c0, cr)
    shift = _masked_mean(cos_last, late) - _masked_mean(cos_last, early)
    shift = shift + _masked_mean(cos_sink, early) - _masked_mean(cos_sink, late)
    converge = (1 - (f["s_norm_without_sink"] - f["s_norm_without_last"]).abs() / (s + EPS)).clamp(0, 1)
    one = torch.ones((), dtype=c0.dtype)
    return {
        "last_dominance": torch.minimum(one, cl / (hi + EPS)),
        "last_alignment": _masked_mean(aligned, valid),
        "last_removal": _masked_mean(drop_last, valid),
        "last_between": torch.minimum(torch.minimum(one, cl / (lo + EPS)), hi / (cl + EPS)),
        "alignment_shift": (shift / (2 * config.shift_full)).clamp(0, 1),
        "loo_convergence": _masked_mean(converge, late),
        "sink_weight": torch.minimum(one, c0 / (cl + EPS)),
        "weak_last": 1 - _masked_mean(aligned, below),
        "sink_removal": (0.5 + (_masked_mean(drop_sink, valid) - _masked_mean(drop_last, valid)) / 2).clamp(0, 1),
    }


def regime_scores(criteria: Mapping[str, Tensor], config: TaxonomyConfig) -> Float[Tensor, "*batch 3"]:
    """Each regime's score in [0, 1]: its three sub-scores combined, ``[*batch, 3]`` in REGIMES order."""
    stacked = torch.stack(
        [torch.stack([criteria[name] for name in CRITERIA[regime]], dim=-1) for regime in REGIMES], dim=-2
    )  # [*batch, regime, criterion]
    if config.combine == "mean":
        return stacked.mean(-1)
    return stacked.clamp(min=EPS).log().mean(-1).exp()


def labels_from_scores(scores: Float[Tensor, "*batch 3"]) -> Int[Tensor, "*batch"]:
    """Argmax over regimes; exact ties go to the first in REGIMES order, NaN scores lose.

    >>> labels_from_scores(torch.tensor([[0.2, 0.5, 0.5], [0.9, float("nan"), 0.1]])).tolist()
    [1, 0]
    """
    # torch.argmax returns the first of equal maxima.
    return torch.nan_to_num(scores, nan=-1.0).argmax(-1)


@dataclass(frozen=True)
class HeadTaxonomy:
    """Regime labels of every analysed head, with the evidence behind them.

    Attributes:
        labels: index into ``REGIMES`` per head, ``[layer, head_index]``.
        scores: each regime's score in [0, 1], ``[layer, head_index, 3]``.
        confidence: fraction of the document-bootstrap replicates whose label
            (from their own feature means) agrees with ``labels``,
            ``[layer, head_index]``; replicates that draw no document are
            left out. NaN where the result keeps no replicates of the
            features (run with ``bootstrap_fields`` including
            ``REGIME_INPUTS``, see `classify_heads`).
        margin: best score minus second best, ``[layer, head_index]``.
        criteria: the nine sub-scores, name -> ``[layer, head_index]``.
        features: the taxonomy features averaged over sequences, name ->
            ``[layer, head_index, ...]``.
        precision, recall: the selection metrics, ``[layer, head_index, n]``.
        n_grid: the selection sizes N, ``[n]``.
        layers, heads: the analysed layers and heads (axes of every tensor).
        config: the TaxonomyConfig used.
    """

    labels: Int[Tensor, "layer head_index"]
    scores: Float[Tensor, "layer head_index 3"]
    confidence: Float[Tensor, "layer head_index"]
    margin: Float[Tensor, "layer head_index"]
    criteria: Mapping[str, Tensor]
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

    def counts_by_layer(self) -> Int[Tensor, "layer 3"]:
        """Heads of each regime per layer (Figure 8), columns in REGIMES order."""
        return torch.nn.functional.one_hot(self.labels, len(REGIMES)).sum(1)

    def curves_by_regime(self, name: str = "precision") -> Float[Tensor, "3 n"]:
        """Mean curve over the heads of each regime (Figure 11), NaN for an empty regime.

        Args:
            name: ``"precision"``, ``"recall"`` or a curve feature (e.g. ``"cos_s_last"``).
        """
        if name in ("precision", "recall"):
            curve = getattr(self, name)
        elif name in CURVE_FEATURES or name == "s_norm":
            curve = self.features[name]
        else:
            raise GeometryError(f"name: expected 'precision', 'recall' or one of {CURVE_FEATURES}, got {name!r}")
        member = torch.nn.functional.one_hot(self.labels, len(REGIMES)).bool()  # [layer, head, 3]
        masked = torch.where(member.unsqueeze(-1), curve.unsqueeze(-2), torch.full((), math.nan, dtype=curve.dtype))
        return torch.nanmean(masked.flatten(0, 1), dim=0)

    def example_heads(self) -> dict[str, tuple[int, int] | None]:
        """Per regime, the (layer, head) labelled with it that scores highest for it (None if none)."""
        out: dict[str, tuple[int, int] | None] = {}
        for index, regime in enumerate(REGIMES):
            score = torch.where(self.labels == index, self.scores[..., index], torch.full((), -math.inf))
            flat = int(score.argmax())
            row, col = divmod(flat, score.shape[1])
            out[regime] = (self.layers[row], self.heads[col]) if bool(self.labels[row, col] == index) else None
        return out

    def contributions_by_regime(self) -> dict[str, Float[Tensor, " key"] | None]:
        """||alpha_i v_i|| by key position of each regime's example head (Figure 10), None if the regime is empty."""
        out: dict[str, Tensor | None] = {}
        for regime, where in self.example_heads().items():
            if where is None:
                out[regime] = None
            else:
                layer, head = self.layers.index(where[0]), self.heads.index(where[1])
                out[regime] = self.features["contribution_by_position"][layer, head]
        return out


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
    criteria = regime_criteria(per_head, result.n_grid, config)
    scores = regime_scores(criteria, config)
    labels = labels_from_scores(scores)
    confidence = torch.full(labels.shape, math.nan, dtype=torch.float64)
    if all(result.has_replicates(name) for name in REGIME_INPUTS):
        replicates = {name: result.replicates(name) for name in REGIME_INPUTS}  # [replicate, layer, head, ...]
        replicate_scores = regime_scores(regime_criteria(replicates, result.n_grid, config), config)
        # A replicate whose weights leave no document has NaN features and no label: it is left out,
        # not counted as a vote for the first regime (labels_from_scores gives an all-NaN row label 0).
        labelled = ~replicate_scores.isnan().all(-1)
        agree = (labels_from_scores(replicate_scores) == labels) & labelled
        confidence = agree.sum(0).double() / labelled.sum(0).double()  # NaN where no replicate has a label
    top2 = torch.nan_to_num(scores, nan=-1.0).topk(2, dim=-1).values
    return HeadTaxonomy(
        labels=labels,
        scores=scores.float(),
        confidence=confidence.float(),
        margin=(top2[..., 0] - top2[..., 1]).float(),
        criteria={name: t.float() for name, t in criteria.items()},
        features=per_head,
        precision=result.per_head("precision"),
        recall=result.per_head("recall"),
        n_grid=result.n_grid,
        layers=tuple(result.layers),
        heads=tuple(result.heads),
        config=config,
    )


def _with_taxonomy(config: GeometryConfig | None) -> GeometryConfig:
    if config is None:
        return GeometryConfig(diagnostics=("taxonomy",))
    if not isinstance(config, GeometryConfig):
        raise GeometryError(f"config: expected a GeometryConfig or None, got {type(config).__name__}")
    if "taxonomy" in config.diagnostics:
        return config
    return config.with_overrides(diagnostics=(*config.diagnostics, "taxonomy"))


def classify_heads(
    result_or_model: Any, tokens: Any = None, config: GeometryConfig | None = None, *, taxonomy: Any = None
) -> HeadTaxonomy:
    """Label every analysed head Retriever, Mixer or Reset, with the scores and features behind it.

    Args:
        result_or_model: a GeometryResult computed with ``diagnostics`` including
            ``"taxonomy"``, or a TransformerLens model (then ``tokens`` is required).
        tokens: for a model: token ids ``[batch, pos]``, a string or a list of strings.
        config: for a model: the GeometryConfig of the run (``"taxonomy"`` is
            added to its diagnostics).
        taxonomy: the TaxonomyConfig (thresholds); default ``TaxonomyConfig()``.

    Returns:
        HeadTaxonomy with ``labels`` ``[layer, head_index]`` indexing ``REGIMES``.

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
    """Score every head for one regime, shaped like ``transformer_lens.head_detector.detect_head``.

    Args:
        model: a TransformerLens model.
        seq: a string, a list of strings (scored on the features averaged over
            them, where ``detect_head`` averages the scores) or token ids.
        regime: one of ``REGIMES``.
        heads: as in ``detect_head``: a list of (layer, head) or a dict
            layer -> heads; other heads score -1. Default: every head.
        config: the GeometryConfig of the run.
        taxonomy: the TaxonomyConfig.

    Returns:
        The regime's score in [0, 1] per head, ``[n_layers, n_heads]`` (-1 for
        heads not asked for).

    Raises:
        GeometryError: unknown regime, bad heads or any bad input of classify_heads.
    """
    if regime not in REGIMES:
        raise GeometryError(f"regime: expected one of {REGIMES}, got {regime!r}")
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
    scores = torch.full((n_layers, n_heads), -1.0)
    index = REGIMES.index(regime)
    layer_at = torch.tensor([found.layers.index(layer) for layer, _ in pairs])
    head_at = torch.tensor([found.heads.index(head) for _, head in pairs])
    wanted = torch.tensor(pairs)
    scores[wanted[:, 0], wanted[:, 1]] = found.scores[layer_at, head_at, index]
    return scores
