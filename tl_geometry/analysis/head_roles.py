"""Head roles: the paper's Retriever / Mixer / Reset (section 4.2), plus Content, with probabilities and sub-types.

The rules read the role features of `tl_geometry.diagnostics.role_features`, measured
on a seeded sample of query positions per sequence and averaged over the
sample and the documents. For one query row, o = sum_i alpha_i v_i is the
head's output before W_O, y_i = alpha_i v_i, L the query's own position and
s(N) the sum of y_i over the top-N keys.

- share_sink, share_self, share_rest: the shares <y_k, o> / ||o||^2 of the sink,
  the query's own token and the other visible keys ("the rest") in o; they sum
  to 1. This makes the paper's "relative magnitudes" (Figure 10) exact.
- align_self_excess, align_sink_excess: cos(s(N), v_L) and cos(s(N), v_0) minus
  their expectation when the top-N set is replaced by a random N-subset with
  the same weights, averaged over 1 <= N < n (n the visible keys).
- shift_self_raw, shift_sink_raw: the slope of cos(s(N), v_L) and cos(s(N),
  v_0) themselves against ln N (the paper's curves; the excess over chance is
  pinned to 0 at N = n, so its slope cannot say "shifts towards v_L").
- rest_effective_share: the effective number of the rest's keys (exp of the
  entropy of their weights) over their count; top_rest_share, previous_token
  (the share of rows whose top rest key is the previous token).

z-scores are a head's mean over its bootstrap standard error (the standard
deviation of its replicates over documents and, within them, query rows).
The rules, in order; the first that holds gives the role:

1. Mixer. Paper: "Last token is intermediate between sink and rest: alignment
   shifts from v_0 at small N towards v_L as N increases". share_self lies
   between share_sink and share_rest, each gap at least ``z_shift`` standard
   errors wide (two shares that tie within their noise are not ordered),
   shift_self_raw rises (its z above
   ``z_shift``, its size at least ``shift_min``) and shift_sink_raw falls (z
   below -``z_shift``, size at least ``shift_min``).
2. Retriever. Paper: "Last token dominates: ||alpha_L v_L|| is largest; s(N)
   stays strongly aligned with v_L (high cos(s, v_L)) across N". share_self is
   the largest share and align_self_excess
   is above chance: its z exceeds ``z_align`` and it reaches ``align_min``
   (aligned beyond random sets, not merely high: random sets already reach a
   cosine of 0.5 in many heads).
3. Reset. Paper: "Sink dominates or mass is broadly spread: ||alpha_0 v_0|| is
   comparable to or exceeds the others; s(N) remains sink-biased with weak
   cos(s, v_L) except at very large N". share_sink is at least share_rest; or
   the rest dominates but is broadly spread: its top key holds less than
   ``concentrated`` of the rest's weight (top_rest_share, averaged over rows);
   or the rest's top key is a secondary sink (below).
4. Content (not in the paper): the rest dominates and is concentrated: its top
   key holds at least ``concentrated`` of the rest's weight. Previous-token heads,
   induction and copy heads attend to one specific earlier token, which none
   of the paper's roles describes.

A head whose share_self is largest but not aligned beyond chance falls
through to rules 3-4 (its sink and rest decide).

Sub-types name the key a head attends to: a fixed lag k behind the query
(``"previous-token"`` for k = 1, else ``"lag k"``), or a secondary sink (an
early key, positions 1..early-1 after the sink, that is the top rest key of
the later rows; which early key varies from document to document). The lag
candidate is the lag 1..reach-1 that is the top rest key of the largest
share of *all* sampled rows; the secondary sink's candidate share is that of
the later rows whose top rest key is early; the larger share is the
candidate. It is named only where it is the top rest key of at least
``subtype_rows`` of those rows, carries a mean attention weight of at least
``subtype_attention`` and an output share of at least ``subtype_output``,
and, for a lag, is a peak: its weight at least ``subtype_peak`` times that
of each neighbouring lag (the null for a recency-biased head, whose top rest
key is the previous token in most rows while its weight decays smoothly over
the last keys). A secondary sink is sink-like, so it is read as the paper's
"sink dominates": a Content head whose sub-type is a secondary sink is Reset,
its Content probability moved to Reset. Lag sub-types are given to Content
heads, secondary sinks to Reset heads. On a random token sequence repeated
with period T, an induction head's top key is at lag T - 1 (the token after
the previous occurrence of the query's token).

The paper's rules read literally (``HeadRoles.literal``, beside ours): the
magnitudes are the norms ||alpha_0 v_0||, ||alpha_L v_L|| and the largest
||alpha_i v_i|| of the rest (Figure 10), the alignments the raw cosines.
Mixer: ||alpha_L v_L|| strictly between the other two and the raw shifts as
in rule 1. Retriever: ||alpha_L v_L|| the largest and the mean raw cos(s(N),
v_L) at least ``literal_align``. Reset: ||alpha_0 v_0|| at least
``comparable`` times the largest other, or the rest broadly spread (as in
rule 3), and s(N) sink-biased: the mean raw cos(s(N), v_0) above cos(s(N),
v_L), which stays below ``literal_align``. Otherwise ``"none"``: none of the
paper's roles. These are point labels (no probabilities).

Probabilities: the share of bootstrap replicates whose feature means give
each role (the z-scores keep the head's standard errors). The label is the
most probable role where it beats the runner-up by ``margin``, else
``"uncertain"`` (the two candidates are in ``probabilities`` and ``runner_up``).
"""

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from tl_geometry._renamed import old_attribute, old_names
from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.diagnostics.selection import PRECISION, RECALL, S_NORM
from tl_geometry.diagnostics.role_features import (
    ALIGN_SELF_EXCESS,
    ATTENTION_AT_LAG,
    CONTRIBUTION_BY_POSITION,
    CONTRIBUTION_LAST,
    CONTRIBUTION_SINK,
    CONTRIBUTION_TOP_REST,
    COS_SELF_RAW,
    COS_SINK_RAW,
    EARLY_ATTENTION,
    EARLY_OUTPUT_SHARE,
    EARLY_POSITION,
    EARLY_TOP_REST,
    LAG_FEATURES,
    LITERAL_FEATURES,
    OUTPUT_SHARE_AT_LAG,
    REST_EFFECTIVE_SHARE,
    ROLE_FEATURES,
    SHARE_REST,
    SHARE_SELF,
    SHARE_SINK,
    SHIFT_SELF,
    SHIFT_SELF_RAW,
    SHIFT_SINK,
    SHIFT_SINK_RAW,
    SUBTYPE_FEATURES,
    ROLE_DIAGNOSTIC_FIELDS,
    TOP_REST_AT_LAG,
    TOP_REST_SHARE,
)
from tl_geometry.errors import GeometryError
from tl_geometry.results.display import head_name
from tl_geometry.results.result import GeometryResult
from tl_geometry.results.table import FieldName, field_name

Role = Literal["retriever", "mixer", "reset", "content"]
"""A head role: the paper's three (its "regimes") and Content (a specific earlier token)."""
ROLES: tuple[str, ...] = get_args(Role)
"""The four roles, in probability order: ``HeadRoles.probabilities[..., i]`` is ROLES[i]."""
RoleLabel = Literal["retriever", "mixer", "reset", "content", "uncertain"]
"""A head's label: a role, or ``"uncertain"`` when no role beats the runner-up by the margin."""
ROLE_LABELS: tuple[str, ...] = get_args(RoleLabel)
"""The five labels, in label order: ``HeadRoles.labels`` index into this tuple."""
NAMED: tuple[str, ...] = ROLES
"""The labels that name a role (every label but "uncertain"), as `detect_role` accepts them."""
UNCERTAIN = ROLE_LABELS.index("uncertain")
MIXER, RETRIEVER, RESET, CONTENT = (ROLES.index(r) for r in ("mixer", "retriever", "reset", "content"))
LiteralRole = Literal["retriever", "mixer", "reset", "none"]
"""The paper's rules read literally: its three roles, or "none" where no rule holds."""
LITERAL_ROLES: tuple[str, ...] = get_args(LiteralRole)
SubtypeKind = Literal["none", "lag", "sink"]
"""What a sub-type names: nothing, a fixed lag behind the query, or a secondary sink (an early key)."""
SUBTYPE_KINDS: tuple[str, ...] = get_args(SubtypeKind)
# The thresholds `threshold_sensitivity` moves by +-10 %.
THRESHOLDS: tuple[str, ...] = (
    "z_align", "align_min", "z_shift", "shift_min", "concentrated", "margin", "subtype_rows", "subtype_attention",
    "subtype_output", "subtype_peak",
)  # fmt: skip
# Thresholds that are shares, capped at 1 when moved.
_SHARES = ("concentrated", "margin", "subtype_rows", "subtype_attention", "subtype_output", "literal_align", "comparable")
PREVIOUS_TOKEN = "previous-token"
SECONDARY_SINK = "secondary sink"


@dataclass(frozen=True)
class RoleConfig:
    """Thresholds of the role rules (see the module docstring).

    Attributes:
        z_align: Retriever: the z of align_self_excess (alignment with v_L
            beyond random sets of the same weights) must exceed it.
        align_min: Retriever: align_self_excess must also reach this (a
            cosine over chance): with enough rows a consistent excess of 0.001
            is significant, and still no alignment.
        z_shift: Mixer: the z of shift_self must exceed it and the z of
            shift_sink fall below its negative (a shift counts where its
            slope against ln N differs from zero by this many standard errors).
        shift_min: Mixer: the slopes must also reach this in size (cosine
            over chance per unit of ln N; 0.01 is a change of 0.07 from N = 1
            to N = 1024).
        concentrated: Content: top_rest_share (the top rest key's share of the
            rest's weight, averaged over rows) at least this; below it a
            rest-dominated head is broadly spread (Reset). In (0, 1].
        margin: the most probable role is the label when its probability beats
            the runner-up's by at least this; else "uncertain". In [0, 1].
        subtype_rows: a sub-type's key is the top rest key of at least this
            share of all sampled rows (of the later rows, for a secondary
            sink). In (0, 1].
        subtype_attention: ... and carries at least this mean attention weight
            (over all sampled rows). In (0, 1]. The default is the detectors'
            cut (a previous-token head puts >= 0.3 of its weight on the
            previous token), so a sub-type means what the field's name means.
        subtype_output: ... and at least this mean share of the head's output
            <y_k, o> / ||o||^2. In (0, 1].
        subtype_peak: ... and, for a lag, at least this many times the weight
            of each neighbouring lag (>= 1): a recency-biased head's weight
            decays smoothly, a previous-token head's peaks.
        literal_align: the literal reading's "strongly aligned" / "weak": a
            mean raw cos(s(N), v_L) at or above this. In (0, 1].
        comparable: the literal reading's "comparable": ||alpha_0 v_0|| at
            least this times the largest other contribution. In (0, 1].

    >>> RoleConfig(margin=2.0)
    Traceback (most recent call last):
    ...
    tl_geometry.errors.GeometryError: margin: expected a number in [0, 1], got 2.0
    """

    z_align: float = 2.0
    align_min: float = 0.05
    z_shift: float = 2.0
    shift_min: float = 0.01
    concentrated: float = 0.3
    margin: float = 0.5
    subtype_rows: float = 0.25
    subtype_attention: float = 0.3  # the detectors' cut, tl_geometry.analysis.detector_agreement.CONFIRMED
    subtype_output: float = 0.1
    subtype_peak: float = 2.0
    literal_align: float = 0.5
    comparable: float = 0.5

    def __post_init__(self) -> None:
        for name in (*THRESHOLDS, "literal_align", "comparable"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise GeometryError(f"{name}: expected a finite number, got {value!r}")
        for name in ("z_align", "z_shift"):
            if getattr(self, name) < 0:
                raise GeometryError(f"{name}: expected a number of standard errors >= 0, got {getattr(self, name)!r}")
        for name in ("align_min", "shift_min"):
            if getattr(self, name) < 0:
                raise GeometryError(f"{name}: expected a number >= 0, got {getattr(self, name)!r}")
        if not 0 <= self.margin <= 1:
            raise GeometryError(f"margin: expected a number in [0, 1], got {self.margin!r}")
        for name in (share for share in _SHARES if share != "margin"):  # margin may be 0
            if not 0 < getattr(self, name) <= 1:
                raise GeometryError(f"{name}: expected a share in (0, 1], got {getattr(self, name)!r}")
        if self.subtype_peak < 1:
            raise GeometryError(f"subtype_peak: expected a ratio >= 1, got {self.subtype_peak!r}")


def role_of(
    features: Mapping[str, Tensor], se: Mapping[str, Tensor], config: RoleConfig
) -> Int[Tensor, "*batch"]:
    """The role (index into ROLES) the rules give, -1 where the shares are undefined.

    Args:
        features: every name of ``ROLE_FEATURES`` -> ``[*batch]`` (head means,
            replicate means or single query rows).
        se: their standard errors, broadcastable to ``[*batch]`` (only those of
            the z-scored features are read: align_self_excess, the raw shifts
            and the three shares).
        config: the thresholds.

    >>> one = lambda v: torch.tensor([v], dtype=torch.float64)
    >>> f = {"share_sink": one(0.1), "share_self": one(0.8), "share_rest": one(0.1), "align_self_excess": one(0.3),
    ...      "shift_self_raw": one(0.0), "shift_sink_raw": one(0.0), "top_rest_share": one(0.5)}
    >>> ROLES[int(role_of(f, {k: one(0.1) for k in f}, RoleConfig()))]
    'retriever'
    """
    sink = features[SHARE_SINK.name].double().nan_to_num(-math.inf)  # no visible sink: it cannot dominate
    own, rest = features[SHARE_SELF.name].double(), features[SHARE_REST.name].double()
    z = {spec: features[spec.name].double() / se[spec.name].double() for spec in (ALIGN_SELF_EXCESS, SHIFT_SELF_RAW, SHIFT_SINK_RAW)}
    mixer = _between(own, sink, rest, se, config) & _shifting(features, z, config)
    aligned = (z[ALIGN_SELF_EXCESS] > config.z_align) & (features[ALIGN_SELF_EXCESS.name].double() >= config.align_min)
    retriever = (own >= sink) & (own >= rest) & aligned
    concentrated = features[TOP_REST_SHARE.name].double() >= config.concentrated
    content = (rest > sink) & concentrated
    role = torch.where(content, CONTENT, RESET)
    role = torch.where(retriever, RETRIEVER, role)
    role = torch.where(mixer, MIXER, role)
    return role.masked_fill(own.isnan() | rest.isnan(), -1)


def _between(own: Tensor, sink: Tensor, rest: Tensor, se: Mapping[str, Tensor], config: RoleConfig) -> Tensor:
    """share_self strictly between share_sink and share_rest, each gap ``z_shift`` standard errors wide.

    Two shares that tie within their noise are not ordered: a head with 0.04
    of its output from the sink and 0.04 from its own token is not "between"
    either way, and read without the noise its replicates split the label.
    The gap's standard error is sqrt(se_a^2 + se_b^2) (the shares' covariance
    left out, which widens it where they rise together).
    """
    se_own, se_sink, se_rest = (se[spec.name].double() for spec in (SHARE_SELF, SHARE_SINK, SHARE_REST))
    low_is_sink = sink <= rest
    se_sink = torch.where(sink.isinf(), 0.0, se_sink)  # no visible sink: own is above it, without noise
    low, se_low = torch.where(low_is_sink, sink, rest), torch.where(low_is_sink, se_sink, se_rest)
    high, se_high = torch.where(low_is_sink, rest, sink), torch.where(low_is_sink, se_rest, se_sink)
    above = own - low > config.z_shift * (se_own.pow(2) + se_low.pow(2)).sqrt()
    below = high - own > config.z_shift * (se_own.pow(2) + se_high.pow(2)).sqrt()
    return above & below


def _shifting(features: Mapping[str, Tensor], z: Mapping[FieldSpec, Tensor], config: RoleConfig) -> Tensor:
    """The Mixer's shift on the raw curves: cos(s, v_L) rises and cos(s, v_0) falls with ln N, each by z and size."""
    rising = (z[SHIFT_SELF_RAW] > config.z_shift) & (features[SHIFT_SELF_RAW.name].double() >= config.shift_min)
    falling = (z[SHIFT_SINK_RAW] < -config.z_shift) & (features[SHIFT_SINK_RAW.name].double() <= -config.shift_min)
    return rising & falling


def literal_role_of(features: Mapping[str, Tensor], se: Mapping[str, Tensor], config: RoleConfig) -> Int[Tensor, "*batch"]:
    """The paper's rules read literally (module docstring): index into LITERAL_ROLES, -1 where undefined.

    Args:
        features: the head means of ``LITERAL_FEATURES``, ``contribution_sink``,
            ``contribution_last``, ``top_rest_share`` and the raw shifts.
        se: the raw shifts' standard errors.
        config: the thresholds.
    """
    sink = features[CONTRIBUTION_SINK.name].double().nan_to_num(0.0)  # no visible sink: it cannot dominate
    own, top = features[CONTRIBUTION_LAST.name].double(), features[CONTRIBUTION_TOP_REST.name].double()
    cos_self, cos_sink = features[COS_SELF_RAW.name].double(), features[COS_SINK_RAW.name].double()
    z = {spec: features[spec.name].double() / se[spec.name].double() for spec in (SHIFT_SELF_RAW, SHIFT_SINK_RAW)}
    between = (own > torch.minimum(sink, top)) & (own < torch.maximum(sink, top))
    mixer = between & _shifting(features, z, config)
    retriever = (own >= sink) & (own >= top) & (cos_self >= config.literal_align)
    sink_or_spread = (sink >= config.comparable * torch.maximum(own, top)) | (
        features[TOP_REST_SHARE.name].double() < config.concentrated
    )
    reset = sink_or_spread & (cos_sink > cos_self) & (cos_self < config.literal_align)
    role = torch.full_like(own, LITERAL_ROLES.index("none"), dtype=torch.long)
    role = torch.where(reset, LITERAL_ROLES.index("reset"), role)
    role = torch.where(retriever, LITERAL_ROLES.index("retriever"), role)
    role = torch.where(mixer, LITERAL_ROLES.index("mixer"), role)
    return role.masked_fill(own.isnan() | top.isnan(), -1)


def labels_from_probabilities(
    probabilities: Float[Tensor, "*batch role"], margin: float
) -> tuple[Int[Tensor, "*batch"], Int[Tensor, "*batch"], Float[Tensor, "*batch"]]:
    """The label (index into ROLE_LABELS), the runner-up (index into ROLES) and p_first - p_second.

    >>> labels, runner_up, gap = labels_from_probabilities(torch.tensor([[0.9, 0.1, 0, 0], [0.5, 0.4, 0.1, 0]]), 0.5)
    >>> [ROLE_LABELS[i] for i in labels.tolist()], [ROLES[i] for i in runner_up.tolist()]
    (['retriever', 'uncertain'], ['mixer', 'mixer'])
    """
    top = probabilities.topk(2, dim=-1)
    gap = top.values[..., 0] - top.values[..., 1]
    labels = torch.where(gap >= margin - 1e-12, top.indices[..., 0], UNCERTAIN)
    labels = labels.masked_fill(probabilities.isnan().any(-1), UNCERTAIN)
    return labels, top.indices[..., 1], gap


@dataclass(frozen=True)
class Subtypes:
    """Each head's sub-type candidate and its evidence, ``[layer, head_index]`` (module docstring).

    Attributes:
        kind: index into ``SUBTYPE_KINDS``: "lag" or "sink" where the
            candidate passes every floor, else "none".
        candidate: index into ``SUBTYPE_KINDS`` of the candidate's kind, named or not.
        lag: the candidate lag (behind the query) where the candidate is a
            lag, else -1.
        position: for a secondary sink, the early key's mean position after
            the sink over the rows it wins (it may vary between documents);
            NaN for a lag.
        rows: the share of the sampled rows whose top rest key is the
            candidate (for a secondary sink: of the later rows, whose top
            rest key is an early key).
        attention: the candidate key's mean attention weight over those rows
            (for a secondary sink: the largest weight on an early key).
        output: its mean output share <y_k, o> / ||o||^2.
        peak: for a lag, its weight over the larger of its neighbouring lags'
            (inf where they carry none); inf for a secondary sink.
        probability: the normal probability that every floor holds, from
            each floor's z = (mean - floor) / SE over documents (0 or 1 where
            the spread is unknown: one document, or an earlier version's result).
        uncertain: the candidate is neither named nor ruled out: the
            probability and its complement within ``margin`` of each other.
    """

    kind: Int[Tensor, "layer head_index"]
    candidate: Int[Tensor, "layer head_index"]
    lag: Int[Tensor, "layer head_index"]
    position: Float[Tensor, "layer head_index"]
    rows: Float[Tensor, "layer head_index"]
    attention: Float[Tensor, "layer head_index"]
    output: Float[Tensor, "layer head_index"]
    peak: Float[Tensor, "layer head_index"]
    probability: Float[Tensor, "layer head_index"]
    uncertain: Bool[Tensor, "layer head_index"]


def _floor_probability(value: Tensor, floor: float, se: Tensor) -> Tensor:
    """Phi((value - floor) / se): the probability that ``value >= floor``; 1 or 0 where se is unknown or 0."""
    value = value.nan_to_num(-math.inf)
    at_means = (value >= floor).double()
    z = (value - floor) / se
    return torch.where(se.isnan() | (se <= 0) | value.isinf(), at_means, torch.special.ndtr(z.nan_to_num(0.0)))


def subtypes_from_features(
    features: Mapping[str, Tensor], config: RoleConfig, se: Mapping[str, Tensor] | None = None
) -> Subtypes:
    """The sub-type of every head from the head means of ``SUBTYPE_FEATURES`` and, where given, their SE.

    ``se`` maps a feature's name to its standard error over documents (the
    shape of its mean); a feature without one is judged on its mean alone.
    """
    se = se or {}

    def error(name: str, shape: torch.Size) -> Tensor:
        return se[name].double() if name in se else torch.full(shape, math.nan, dtype=torch.float64)

    top = features[TOP_REST_AT_LAG.name].double().nan_to_num(0.0)
    weight = features[ATTENTION_AT_LAG.name].double().nan_to_num(0.0)
    lag_rows, lag = top[..., 1:].max(-1)  # lag 0 is the query's own token
    lag = lag + 1
    at = lag.unsqueeze(-1)
    # The neighbours: lag - 1 where it is a rest lag (>= 1), lag + 1 where there is one.
    below = torch.where(at > 1, weight.gather(-1, (at - 1).clamp(min=0)), 0.0)
    above = torch.nn.functional.pad(weight, (0, 1)).gather(-1, at + 1)
    neighbour = torch.maximum(below, above).squeeze(-1)
    lag_weight = weight.gather(-1, at).squeeze(-1)
    lag_peak = torch.where(neighbour > 0, lag_weight / neighbour, math.inf)
    lag_output = features[OUTPUT_SHARE_AT_LAG.name].double().gather(-1, at).squeeze(-1)
    sink_rows = features[EARLY_TOP_REST.name].double().nan_to_num(0.0)
    use_sink = sink_rows > lag_rows  # ties: the lag
    rows = torch.where(use_sink, sink_rows, lag_rows)
    attention = torch.where(use_sink, features[EARLY_ATTENTION.name].double(), lag_weight)
    output = torch.where(use_sink, features[EARLY_OUTPUT_SHARE.name].double(), lag_output)
    peak = torch.where(use_sink, math.inf, lag_peak)
    # Each floor's standard error at the candidate; the peak's is that of weight - subtype_peak x neighbour.
    lag_se = {name: error(name, top.shape) for name in LAG_FEATURES}
    weight_se = lag_se[ATTENTION_AT_LAG.name]
    below_se = torch.where(at > 1, weight_se.gather(-1, (at - 1).clamp(min=0)), 0.0)
    above_se = torch.nn.functional.pad(weight_se, (0, 1)).gather(-1, at + 1)
    neighbour_se = torch.where((below >= above) & (at > 1), below_se, above_se).squeeze(-1)  # a tie: the lower lag
    at_weight_se = weight_se.gather(-1, at).squeeze(-1)
    scalar = rows.shape
    rows_se = torch.where(use_sink, error(EARLY_TOP_REST.name, scalar), lag_se[TOP_REST_AT_LAG.name].gather(-1, at).squeeze(-1))
    attention_se = torch.where(use_sink, error(EARLY_ATTENTION.name, scalar), at_weight_se)
    output_se = torch.where(use_sink, error(EARLY_OUTPUT_SHARE.name, scalar), lag_se[OUTPUT_SHARE_AT_LAG.name].gather(-1, at).squeeze(-1))
    peak_margin = torch.where(use_sink, math.inf, lag_weight - config.subtype_peak * neighbour)
    peak_se = (at_weight_se.square() + config.subtype_peak**2 * neighbour_se.square()).sqrt()
    probability = (
        _floor_probability(rows, config.subtype_rows, rows_se)
        * _floor_probability(attention, config.subtype_attention, attention_se)
        * _floor_probability(output, config.subtype_output, output_se)
        * _floor_probability(peak_margin, 0.0, peak_se)
    )  # fmt: skip
    # The roles' margin: named where the probability beats its complement by it, ruled out where the complement does.
    named = probability - (1 - probability) >= config.margin - 1e-12
    ruled_out = (1 - probability) - probability >= config.margin - 1e-12
    candidate = torch.where(use_sink, SUBTYPE_KINDS.index("sink"), SUBTYPE_KINDS.index("lag"))
    kind = torch.where(named, candidate, SUBTYPE_KINDS.index("none"))
    undefined = features[TOP_REST_AT_LAG.name].isnan().all(-1)
    position = torch.where(use_sink, features[EARLY_POSITION.name].double(), math.nan)
    return Subtypes(
        kind=kind.masked_fill(undefined, 0), candidate=candidate, lag=torch.where(use_sink | undefined, -1, lag),
        position=position, rows=rows.masked_fill(undefined, math.nan), attention=attention.masked_fill(undefined, math.nan),
        output=output.masked_fill(undefined, math.nan), peak=peak.masked_fill(undefined, math.nan),
        probability=probability.masked_fill(undefined, math.nan), uncertain=~named & ~ruled_out & ~undefined,
    )  # fmt: skip


# Results of the version before the raw shifts measured the shifts of the excess over chance only: their Mixer is
# judged on those (the rule of that version), and `HeadRoles.missing` says so.
_EARLIER_SHIFTS = {SHIFT_SINK_RAW.name: SHIFT_SINK.name, SHIFT_SELF_RAW.name: SHIFT_SELF.name}


def _stored(result: GeometryResult, name: str) -> str:
    """The field a role feature is read from: itself, or the earlier version's shift where the raw one is missing."""
    if name not in result.fields and _EARLIER_SHIFTS.get(name) in result.fields:
        return _EARLIER_SHIFTS[name]
    return name


def _no_subtypes(shape: torch.Size) -> Subtypes:
    """The sub-types of a result that did not measure them: none named, no evidence."""
    nan = torch.full(shape, math.nan, dtype=torch.float64)
    none = torch.zeros(shape, dtype=torch.long)
    return Subtypes(kind=none, candidate=none, lag=none - 1, position=nan, rows=nan, attention=nan, output=nan, peak=nan,
                    probability=nan, uncertain=torch.zeros(shape, dtype=torch.bool))


def _subtype_errors(result: GeometryResult) -> dict[str, Tensor]:
    """The sub-type features' standard errors over documents, where the result kept their spread (two documents or more)."""
    return {name: result.sem(name) for name in SUBTYPE_FEATURES
            if name in result.fields and result.spec(name).documents == "moments" and result.n_documents > 1}  # fmt: skip


def _standard_errors(result: GeometryResult) -> dict[str, Tensor]:
    """Each role feature's bootstrap standard error (replicate std), else its sem over documents."""
    out = {}
    for name in ROLE_FEATURES:
        stored = _stored(result, name)
        if result.has_replicates(stored):
            reps = result.replicates(stored)
            mean = torch.nanmean(reps, 0, keepdim=True)
            count = (~reps.isnan()).sum(0)
            out[name] = ((reps - mean).nan_to_num(0.0).pow(2).sum(0) / (count - 1).clamp(min=1)).sqrt()
        else:
            out[name] = result.sem(stored)
    return out


@dataclass(frozen=True)
class HeadRoles:
    """The role of every analysed head, with its probability, runner-up and evidence.

    Attributes:
        labels: index into ``ROLE_LABELS`` per head (a role, or ``"uncertain"``),
            ``[layer, head_index]``.
        point: the role the rules give on the head's feature means (index into
            ROLES), ``[layer, head_index]``.
        probabilities: each role's share of bootstrap replicates, ``[layer,
            head_index, role]`` in ROLES order (NaN without replicates).
        runner_up: the second most probable role (index into ROLES).
        margin: the top probability minus the runner-up's.
        subtypes: each head's sub-type candidate and its evidence (`Subtypes`).
        literal: the paper's rules read literally, index into
            ``LITERAL_ROLES`` (-1 where undefined), ``[layer, head_index]``.
        features: the role features' head means, name -> ``[layer, head_index, ...]``.
        se: their standard errors (bootstrap), name -> ``[layer, head_index]``.
        precision, recall: the selection metrics, ``[layer, head_index, n]``.
        n_grid: the selection sizes N, ``[n]``.
        layers, heads: the analysed layers and heads (axes of every tensor).
        config: the RoleConfig used.
        missing: the role features the result lacks (one analysed by an
            earlier version): without the raw shifts the Mixer is judged on
            the shifts of the excess over chance (that version's rule),
            without the sub-type features no sub-type is named, without the
            literal ones ``literal`` is -1; ``"<lag feature> spread"`` where
            the lag features kept their means only (no sub-type is then
            uncertain: each is judged on its means).
    """

    labels: Int[Tensor, "layer head_index"]
    point: Int[Tensor, "layer head_index"]
    probabilities: Float[Tensor, "layer head_index role"]
    runner_up: Int[Tensor, "layer head_index"]
    margin: Float[Tensor, "layer head_index"]
    subtypes: Subtypes
    literal: Int[Tensor, "layer head_index"]
    features: Mapping[str, Tensor]
    se: Mapping[str, Tensor]
    precision: Float[Tensor, "layer head_index n"]
    recall: Float[Tensor, "layer head_index n"]
    n_grid: Int[Tensor, " n"]
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    config: RoleConfig = field(default_factory=RoleConfig)
    missing: tuple[str, ...] = ()

    def __repr__(self) -> str:  # a summary, not every tensor (see tl_geometry.analysis.head_roles_summary)
        from tl_geometry.analysis.head_roles_summary import roles_summary

        return roles_summary(self).text()

    def _repr_html_(self) -> str:
        from tl_geometry.analysis.head_roles_summary import roles_summary

        return roles_summary(self).html()

    def label_names(self) -> list[list[str]]:
        """The labels as names, ``[layer][head_index]``."""
        return [[ROLE_LABELS[i] for i in row] for row in self.labels.tolist()]

    def subtype(self, layer: int, head: int) -> str | None:
        """The key the head attends to: ``"previous-token"``, ``"lag k"`` or ``"secondary sink"``.

        Lags for Content heads, secondary sinks (an early key that wins the
        later rows) for Reset heads; None for other labels, where the
        candidate misses a floor of ``RoleConfig`` (rows, weight, output
        share, peak), and where it is uncertain (`subtype_uncertain`).
        """
        i, j = self.layers.index(layer), self.heads.index(head)
        return self._subtype_name(i, j, int(self.subtypes.kind[i, j]))

    def subtype_uncertain(self, layer: int, head: int) -> str | None:
        """The sub-type the head would have if its candidate were not within noise of a floor, else None.

        E.g. ``"previous-token"`` for a Content head whose previous-token
        weight sits near ``subtype_attention`` (the probability that every
        floor holds is neither above ``(1 + margin) / 2`` nor below ``(1 - margin) / 2``).
        """
        i, j = self.layers.index(layer), self.heads.index(head)
        if not bool(self.subtypes.uncertain[i, j]):
            return None
        return self._subtype_name(i, j, int(self.subtypes.candidate[i, j]))

    def _subtype_name(self, i: int, j: int, kind_index: int) -> str | None:
        kind, label = SUBTYPE_KINDS[kind_index], int(self.labels[i, j])
        if kind == "lag" and label == CONTENT:
            lag = int(self.subtypes.lag[i, j])
            return PREVIOUS_TOKEN if lag == 1 else f"lag {lag}"
        if kind == "sink" and label == RESET:
            return SECONDARY_SINK
        return None

    def subtype_text(self, layer: int, head: int) -> str | None:
        """`subtype` with its evidence, e.g. ``"lag 63: top rest key in 81 % of rows, weight 0.52, output 0.40"``.

        An uncertain sub-type reads ``"uncertain: previous-token: ...; every floor holds with probability 0.68"``.
        """
        sub, maybe = self.subtype(layer, head), self.subtype_uncertain(layer, head)
        if sub is None and maybe is None:
            return None
        i, j = self.layers.index(layer), self.heads.index(head)
        t = self.subtypes
        name = sub or maybe
        where = f" (an early key, mean position {float(t.position[i, j]):.1f})" if name == SECONDARY_SINK else ""
        rows = "later rows" if name == SECONDARY_SINK else "rows"
        return (f"{'' if sub else 'uncertain: '}{name}{where}: top rest key in {100 * float(t.rows[i, j]):.0f} % of {rows}, "
                f"weight {float(t.attention[i, j]):.2f}, output {float(t.output[i, j]):.2f}"
                + ("" if sub else f"; every floor holds with probability {float(t.probability[i, j]):.2f}"))

    def literal_names(self) -> list[list[str]]:
        """The paper's rules read literally, as names ``[layer][head_index]`` ("none": no rule holds; "-": not measured)."""
        return [[LITERAL_ROLES[i] if i >= 0 else "-" for i in row] for row in self.literal.tolist()]

    def counts_by_layer(self) -> Int[Tensor, "layer 5"]:
        """Heads of each label per layer (Figure 8), columns in ROLE_LABELS order (uncertain last)."""
        return torch.nn.functional.one_hot(self.labels, len(ROLE_LABELS)).sum(1)

    def describe(self, layer: int, head: int) -> str:
        """What kind of head is ``L<layer>H<head>``, in one line with its evidence."""
        i, j = self.layers.index(layer), self.heads.index(head)
        p = self.probabilities[i, j]
        label = ROLE_LABELS[int(self.labels[i, j])]
        f = {name: float(t[i, j]) for name, t in self.features.items() if t.ndim == 2}
        odds = ", ".join(f"{r} {float(p[k]):.2f}" for k, r in enumerate(ROLES))
        if label == "uncertain":
            first = ROLES[int(p.nan_to_num(-1).argmax())]
            head_line = f"{head_name(layer, head)}: uncertain between {first} and {ROLES[int(self.runner_up[i, j])]}"
        else:
            sub = self.subtype_text(layer, head)
            head_line = f"{head_name(layer, head)}: {label}" + (f" ({sub})" if sub else "")
        return (
            f"{head_line}; probabilities {odds}; shares of the output: sink {f[SHARE_SINK.name]:.2f}, own token "
            f"{f[SHARE_SELF.name]:.2f}, rest {f[SHARE_REST.name]:.2f} (effective share of rest keys "
            f"{f[REST_EFFECTIVE_SHARE.name]:.3f}); alignment with v_L over chance {f[ALIGN_SELF_EXCESS.name]:+.3f}; "
            f"the paper's rules read literally: {self.literal_names()[i][j]}"
            + (f" (this result of an earlier version lacks {', '.join(self.missing)}: analyse again for the raw "
               "shifts, the sub-types and the literal reading)" if self.missing else "")
        )

    def table(self) -> list[dict[str, Any]]:
        """One row per head: layer, head, label, subtype, subtype_uncertain, literal, runner_up, margin and each role's
        probability."""
        rows = []
        for i, layer in enumerate(self.layers):
            for j, head in enumerate(self.heads):
                row = {"layer": layer, "head": head, "label": ROLE_LABELS[int(self.labels[i, j])],
                       "subtype": self.subtype(layer, head), "subtype_uncertain": self.subtype_uncertain(layer, head),
                       "literal": self.literal_names()[i][j],
                       "runner_up": ROLES[int(self.runner_up[i, j])], "margin": float(self.margin[i, j])}  # fmt: skip
                row.update({f"p_{role}": float(self.probabilities[i, j, k]) for k, role in enumerate(ROLES)})
                rows.append(row)
        return rows

    def __getattr__(self, name: str) -> Any:
        """``curves_by_regime`` and ``contributions_by_regime``: the former names of two methods, with a warning."""
        return old_attribute(self, name)

    def curves_by_role(self, name: FieldName = PRECISION) -> Float[Tensor, "5 n"]:
        """Mean curve over the heads of each label (Figure 11), NaN for an empty one.

        Args:
            name: ``"precision"``, ``"recall"`` or a curve feature of ``features``.
        """
        name = field_name(name)
        measured = {PRECISION.name: self.precision, RECALL.name: self.recall}
        if name in measured:
            curve = measured[name]
        elif name in self.features and self.features[name].ndim == 3:
            curve = self.features[name]
        else:
            curves = [k for k, t in self.features.items() if t.ndim == 3]
            raise GeometryError(f"name: expected 'precision', 'recall' or one of {curves}, got {name!r}")
        member = torch.nn.functional.one_hot(self.labels, len(ROLE_LABELS)).bool()  # [layer, head, 5]
        masked = torch.where(member.unsqueeze(-1), curve.unsqueeze(-2), torch.full((), math.nan, dtype=curve.dtype))
        return torch.nanmean(masked.flatten(0, 1), dim=0)

    def example_heads(self) -> dict[str, tuple[int, int] | None]:
        """Per label, the (layer, head) with the largest probability of it (None if no head has the label)."""
        out: dict[str, tuple[int, int] | None] = {}
        for index, role in enumerate(ROLE_LABELS):
            score = self.margin if index == UNCERTAIN else self.probabilities[..., index]
            if index == UNCERTAIN:
                score = -score  # the closest call
            score = torch.where(self.labels == index, score.double().nan_to_num(-1e9), -math.inf)
            row, col = divmod(int(score.argmax()), score.shape[1])
            out[role] = (self.layers[row], self.heads[col]) if bool(self.labels[row, col] == index) else None
        return out

    def contributions_by_role(self) -> dict[str, Float[Tensor, " key"] | None]:
        """||alpha_i v_i|| by key position of each label's example head (Figure 10), None if it is empty."""
        out: dict[str, Tensor | None] = {}
        for role, where in self.example_heads().items():
            if where is None or CONTRIBUTION_BY_POSITION.name not in self.features:
                out[role] = None
            else:
                layer, head = self.layers.index(where[0]), self.heads.index(where[1])
                out[role] = self.features[CONTRIBUTION_BY_POSITION.name][layer, head]
        return out


def _require_roles(result: GeometryResult) -> None:
    if not isinstance(result, GeometryResult):
        raise GeometryError(f"result: expected a GeometryResult, got {type(result).__name__}")
    missing = [name for name in ROLE_FEATURES if _stored(result, name) not in result.fields]
    if not missing:
        return
    if any(name in result.fields for name in ROLE_DIAGNOSTIC_FIELDS):
        raise GeometryError(
            f"result: it was analysed by an older role diagnostic that did not measure the role features "
            f"{missing} (composition shares, alignment over chance and the raw alignment shifts), so its heads "
            "cannot be given roles; analyse the model again with diagnostics=['roles']"
        )
    raise GeometryError(
        f"result: the GeometryResult lacks the role features {missing}; run it with diagnostics=['roles'] "
        "(e.g. run_with_geometry_hooks(model, tokens, diagnostics=['roles'])) or call "
        "tl_geometry.classify_heads(model, tokens)"
    )


def replicate_roles(result: GeometryResult, config: RoleConfig | None = None) -> Int[Tensor, "replicate layer head_index"]:
    """The role (index into ROLES) each bootstrap replicate's feature means give every head; -1 where undefined.

    The z-scores keep the head's standard errors (those of `roles_from_result`).

    Raises:
        GeometryError: the result lacks the role features or their replicates (``n_bootstrap=0``).
    """
    config = config or RoleConfig()
    _require_roles(result)
    if not all(result.has_replicates(_stored(result, name)) for name in ROLE_FEATURES):
        raise GeometryError("result: its role features kept no bootstrap replicates; analyse with n_bootstrap > 0")
    replicates = {name: result.replicates(_stored(result, name)) for name in ROLE_FEATURES}  # [replicate, layer, head]
    return role_of(replicates, _standard_errors(result), config)


def _probabilities(result: GeometryResult, config: RoleConfig) -> Tensor:
    """Each role's share of the replicates whose feature means are defined; NaN without replicates."""
    layer_head = result.per_head(SHARE_SELF).shape
    if not all(result.has_replicates(_stored(result, name)) for name in ROLE_FEATURES):
        return torch.full((*layer_head, len(ROLES)), math.nan, dtype=torch.float64)
    roles = replicate_roles(result, config)
    votes = torch.nn.functional.one_hot(roles.clamp(min=0), len(ROLES)).double() * (roles >= 0).unsqueeze(-1)
    return votes.sum(0) / votes.sum((0, -1)).unsqueeze(-1)  # NaN where no replicate is defined


def roles_from_result(result: GeometryResult, config: RoleConfig | None = None) -> HeadRoles:
    """The role of every head of a result computed with the ``"roles"`` diagnostic (no model runs)."""
    config = config or RoleConfig()
    if not isinstance(config, RoleConfig):
        raise GeometryError(f"config: expected a RoleConfig or None, got {type(config).__name__}")
    _require_roles(result)
    features = {name: result.per_head(name) for name in (*ROLE_DIAGNOSTIC_FIELDS, S_NORM.name) if name in result.fields}
    features.update({name: result.per_head(_stored(result, name)) for name in _EARLIER_SHIFTS})
    se = _standard_errors(result)
    point = role_of(features, se, config)
    probabilities = _probabilities(result, config)
    missing = tuple(name for name in (*_EARLIER_SHIFTS, *LITERAL_FEATURES, *SUBTYPE_FEATURES) if name not in result.fields)
    # An earlier version kept the lag features' means only: its sub-types are judged on the means, without uncertainty.
    missing += tuple(f"{name} spread" for name in LAG_FEATURES if name in result.fields and result.spec(name).documents != "moments")
    subtypes = (subtypes_from_features(features, config, _subtype_errors(result)) if set(SUBTYPE_FEATURES) <= set(features)
                else _no_subtypes(point.shape))  # fmt: skip
    literal = literal_role_of(features, se, config) if set(LITERAL_FEATURES) <= set(features) else torch.full_like(point, -1)
    # A secondary sink is a sink: the Content its concentrated rest gave is Reset's "sink dominates".
    secondary = subtypes.kind == SUBTYPE_KINDS.index("sink")
    point = torch.where(secondary & (point == CONTENT), RESET, point)
    secondary &= ~probabilities.isnan().any(-1)  # without replicates there is nothing to move
    moved = probabilities.clone()
    moved[..., RESET] = torch.where(secondary, probabilities[..., RESET] + probabilities[..., CONTENT], probabilities[..., RESET])
    moved[..., CONTENT] = torch.where(secondary, 0.0, probabilities[..., CONTENT])
    probabilities = moved
    if bool(probabilities.isnan().all()):  # no replicates: the point role, with no probability to beat
        labels = torch.where(point >= 0, point, UNCERTAIN)
        runner_up, gap = torch.zeros_like(point), torch.full(point.shape, math.nan, dtype=torch.float64)
    else:
        labels, runner_up, gap = labels_from_probabilities(probabilities, config.margin)
    return HeadRoles(
        labels=labels, point=point, probabilities=probabilities, runner_up=runner_up, margin=gap,
        subtypes=subtypes, literal=literal, features=features, se=se, missing=missing,
        precision=result.per_head(PRECISION), recall=result.per_head(RECALL), n_grid=result.n_grid,
        layers=tuple(result.layers), heads=tuple(result.heads), config=config,
    )  # fmt: skip


@dataclass(frozen=True)
class SensitivityRow:
    """How many labels change when one threshold moves.

    Attributes:
        threshold: the RoleConfig field moved.
        value: its moved value (the default times 1 -+ step, clipped to its range).
        changed: heads whose label differs from the labels at the defaults.
        counts: heads per label at the moved value, in ROLE_LABELS order.
    """

    threshold: str
    value: float
    changed: int
    counts: tuple[int, ...]


def threshold_sensitivity(
    result: GeometryResult, config: RoleConfig | None = None, step: float = 0.1
) -> list[SensitivityRow]:
    """Labels changed when each threshold of ``THRESHOLDS`` moves by -step and +step (relative).

    Args:
        result: a result with the role features.
        config: the thresholds to move from (default ``RoleConfig()``).
        step: the relative move, in (0, 1).

    Returns:
        Two rows per threshold (down, then up).
    """
    if isinstance(step, bool) or not isinstance(step, (int, float)) or not 0 < step < 1:
        raise GeometryError(f"step: expected a relative move in (0, 1), e.g. 0.1, got {step!r}")
    config = config or RoleConfig()
    base = roles_from_result(result, config).labels
    rows = []
    for name in THRESHOLDS:
        value = getattr(config, name)
        for sign in (-1, 1):
            moved = value * (1 + sign * step)
            if name in _SHARES:
                moved = min(moved, 1.0)
            labels = roles_from_result(result, replace(config, **{name: moved})).labels
            counts = torch.bincount(labels.flatten(), minlength=len(ROLE_LABELS))
            rows.append(SensitivityRow(name, float(moved), int((labels != base).sum()), tuple(counts.tolist())))
    return rows


@dataclass(frozen=True)
class QueryRoles:
    """The role of every head at every kept query position of every prompt (``keep_queries=True``).

    Attributes:
        labels: index into ``ROLES``, ``[doc, layer, head_index, query]``; -1
            at padded or undefined queries.
        query_positions: the position of each query counted from the
            sequence's first real token, ``[doc, query]`` (-1 where a prompt
            has fewer queries).
        layers, heads: the analysed layers and heads.
        config: the RoleConfig used.
    """

    labels: Int[Tensor, "doc layer head_index query"]
    query_positions: Int[Tensor, "doc query"]
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    config: RoleConfig

    def at(self, doc: int, position: int) -> list[list[str | None]]:
        """The role names of every head for one prompt's query at ``position``, ``[layer][head_index]``."""
        where = (self.query_positions[doc] == position).nonzero().flatten()
        if len(where) == 0:
            kept = [p for p in self.query_positions[doc].tolist() if p >= 0]
            raise GeometryError(
                f"position: document {doc} kept no query at position {position}; its kept positions are {kept} "
                "(analyse with query_positions including it)"
            )
        labels = self.labels[doc, :, :, int(where[0])]
        return [[ROLES[i] if i >= 0 else None for i in row] for row in labels.tolist()]


def classify_queries(result: GeometryResult, config: RoleConfig | None = None) -> QueryRoles:
    """The role of every head at every kept query position of every prompt, each query on its own.

    The rules of `roles_from_result` applied to one query row's features,
    with the head's standard errors for the z-scores: the variant for circuit
    studies where the interesting position (e.g. the IO name in IOI) differs
    from prompt to prompt. A single row has no bootstrap, so these roles carry
    no probability: read them as a description of that forward pass.

    Args:
        result: analysed with ``diagnostics=["roles"]``, ``keep_queries=True``
            and ``settings={"roles": {"queries": "analysed"}}`` (so that the
            features are measured on the kept queries), and the
            ``query_positions`` of interest.
        config: the thresholds (default ``RoleConfig()``).
    """
    config = config or RoleConfig()
    _require_roles(result)
    if result.queries is None or result.query_positions is None:
        raise GeometryError(
            "result: keeps no per-query rows; analyse with keep_queries=True, e.g. run_with_geometry_hooks("
            "model, prompts, diagnostics=['roles'], keep_queries=True, query_positions='all', "
            "settings={'roles': {'queries': 'analysed'}})"
        )
    missing = [name for name in ROLE_FEATURES if _stored(result, name) not in result.queries]
    if missing:
        raise GeometryError(
            f"result: its per-query rows lack the role features {missing}: the roles diagnostic measured its own query "
            "sample; analyse with settings={'roles': {'queries': 'analysed'}} and keep_queries=True"
        )
    se = {name: t.unsqueeze(0).unsqueeze(-1) for name, t in _standard_errors(result).items()}
    rows = {name: result.queries[_stored(result, name)] for name in ROLE_FEATURES}  # [doc, layer, head, query]
    return QueryRoles(
        labels=role_of(rows, se, config), query_positions=result.query_positions,
        layers=tuple(result.layers), heads=tuple(result.heads), config=config,
    )  # fmt: skip


def role_counts(roles: HeadRoles) -> dict[str, int]:
    """Heads per label over every layer, in ROLE_LABELS order."""
    return dict(zip(ROLE_LABELS, roles.counts_by_layer().sum(0).tolist()))


def agreement(first: HeadRoles, second: HeadRoles) -> tuple[float, int]:
    """Share of heads that both label (not uncertain) with the same role, and how many both label."""
    both = (first.labels != UNCERTAIN) & (second.labels != UNCERTAIN)
    n = int(both.sum())
    return (float((first.labels[both] == second.labels[both]).double().mean()) if n else math.nan), n


@dataclass(frozen=True)
class SubtypeAgreement:
    """Sub-types across the roles of disjoint document groups, counted over (head, pair of groups).

    Attributes:
        same_both, both: where both name a sub-type: how many name the same one, of how many.
        same_sure, sure: where either names one and neither's is uncertain (as `agreement` counts the heads
            both label): the same, of how many.
        same_either, either: where either names one: the same, of how many.
        uncertain: per group, the heads whose sub-type is uncertain.
    """

    same_both: int
    both: int
    same_sure: int
    sure: int
    same_either: int
    either: int
    uncertain: tuple[int, ...]


def subtype_agreement(groups: Sequence[HeadRoles]) -> SubtypeAgreement:
    """How the sub-types of the roles of disjoint document groups agree, over every pair of them."""
    counts = dict.fromkeys(("same_both", "both", "same_sure", "sure", "same_either", "either"), 0)
    heads = [(layer, head) for layer in groups[0].layers for head in groups[0].heads]
    for first, second in itertools.combinations(groups, 2):
        for layer, head in heads:
            a, b = first.subtype(layer, head), second.subtype(layer, head)
            if a is None and b is None:
                continue
            same = a == b
            unsure = first.subtype_uncertain(layer, head) is not None or second.subtype_uncertain(layer, head) is not None
            counts["either"] += 1
            counts["same_either"] += same
            if not unsure:
                counts["sure"] += 1
                counts["same_sure"] += same
            if a is not None and b is not None:
                counts["both"] += 1
                counts["same_both"] += same
    uncertain = tuple(sum(t.subtype_uncertain(layer, head) is not None for layer, head in heads) for t in groups)
    return SubtypeAgreement(**counts, uncertain=uncertain)


__all__: Sequence[str] = (
    "ROLES", "ROLE_LABELS", "NAMED", "LITERAL_ROLES", "SUBTYPE_KINDS", "Role", "RoleLabel", "LiteralRole", "RoleConfig",
    "HeadRoles", "QueryRoles", "Subtypes", "SensitivityRow", "role_of", "literal_role_of", "subtypes_from_features",
    "labels_from_probabilities", "roles_from_result", "replicate_roles",
    "threshold_sensitivity", "classify_queries", "role_counts", "agreement", "SubtypeAgreement", "subtype_agreement",
)  # fmt: skip

__getattr__ = old_names(__name__, globals())  # the names they had before (tl_geometry._renamed)
