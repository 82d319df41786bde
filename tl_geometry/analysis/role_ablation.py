"""Head-role ablations read as numbers: the groups, the random head sets they are compared with, and the table.

`tl_geometry.interventions.head_ablation.ablate_roles` runs the model; this module holds
what needs no model:

- `role_groups`: the heads of each role class (a HeadRoles label) and of
  each sub-type (`HeadRoles.subtype`, an opaque string), as
  ``(layer, head)`` tuples;
- `random_head_sets`: seeded random sets with exactly the group's size and
  layer distribution (in each layer, as many heads as the group has there,
  drawn uniformly without replacement from that layer's analysed heads; a
  random set may share heads with the group);
- `bootstrap_interval`: a seeded document bootstrap of a mean;
- `AblationRow` / `RoleAblation`: one row per (group, task, mode) with the
  group's change in loss, its bootstrap interval, and the random band.
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from tl_geometry.analysis.intervals import percentile_interval
from tl_geometry.errors import GeometryError
from tl_geometry.results.display import Summary, field_summary, names, plural

Head = tuple[int, int]
ROLE_LABELS: tuple[str, ...] = ("retriever", "mixer", "reset", "content", "uncertain")
TASKS: tuple[str, ...] = ("natural", "repeated")
ABLATIONS: tuple[str, ...] = ("zero", "mean")


@dataclass(frozen=True)
class HeadGroup:
    """A set of heads to ablate together.

    Attributes:
        name: e.g. ``"role retriever"``, ``"subtype previous-token"``, ``"detector induction"``.
        kind: ``"role"``, ``"subtype"`` or ``"detector"``.
        heads: ``(layer, head)`` pairs, sorted.
        tasks: the tasks it is measured on (``"natural"``, ``"repeated"``).
    """

    name: str
    kind: str
    heads: tuple[Head, ...]
    tasks: tuple[str, ...] = ("natural",)

    def layer_counts(self) -> dict[int, int]:
        """Heads of the group per layer."""
        counts: dict[int, int] = {}
        for layer, _ in self.heads:
            counts[layer] = counts.get(layer, 0) + 1
        return counts


def _check_roles(roles: Any) -> None:
    if not all(hasattr(roles, name) for name in ("layers", "heads", "label_names", "subtype")):
        raise GeometryError(
            f"roles: expected a HeadRoles (from tg.classify_heads(result)), got {type(roles).__name__}"
        )


def role_groups(roles: Any, *, subtypes: bool = True, min_heads: int = 1, uncertain: bool = True) -> list[HeadGroup]:
    """One group per role label present (retriever, mixer, reset, content, uncertain) and per sub-type.

    Args:
        roles: a HeadRoles (read through ``layers``, ``heads``, ``label_names()`` and ``subtype()``).
        subtypes: also one group per distinct sub-type string (whatever label its heads have).
        min_heads: leave out sub-type groups with fewer heads than this (every role class present is kept).
        uncertain: also the group of heads labelled "uncertain" (not a role; its heads are still in the sub-types).

    A sub-type group named ``"subtype previous-token"`` is also measured on
    repeated random tokens (the second-copy loss); every group on natural text.
    """
    _check_roles(roles)
    if isinstance(min_heads, bool) or not isinstance(min_heads, int) or min_heads < 1:
        raise GeometryError(f"min_heads: expected an integer >= 1, got {min_heads!r}")
    names = roles.label_names()
    by_label: dict[str, list[Head]] = {}
    by_subtype: dict[str, list[Head]] = {}
    for i, layer in enumerate(roles.layers):
        for j, head in enumerate(roles.heads):
            by_label.setdefault(names[i][j], []).append((int(layer), int(head)))
            sub = roles.subtype(layer, head)
            if subtypes and sub is not None:
                by_subtype.setdefault(str(sub), []).append((int(layer), int(head)))
    groups = [HeadGroup(f"role {label}", "role", tuple(sorted(by_label[label])))
              for label in ROLE_LABELS if label in by_label and (uncertain or label != "uncertain")]
    for sub in sorted(by_subtype):
        tasks = ("natural", "repeated") if sub == "previous-token" else ("natural",)
        groups.append(HeadGroup(f"subtype {sub}", "subtype", tuple(sorted(by_subtype[sub])), tasks))
    return [g for g in groups if g.kind == "role" or len(g.heads) >= min_heads]


def random_head_sets(
    group: Sequence[Head], available: Mapping[int, Sequence[int]], n_draws: int, seed: int
) -> list[tuple[Head, ...]]:
    """``n_draws`` random head sets with exactly the group's size and layer distribution.

    In each layer the group touches, as many heads as the group has there are
    drawn uniformly without replacement from ``available[layer]`` (the
    analysed heads of that layer); the draws are seeded (``seed`` and the
    draw's index) and do not depend on the other groups.

    >>> sets = random_head_sets([(0, 1), (2, 0), (2, 3)], {0: [0, 1, 2], 2: [0, 1, 2, 3]}, 2, seed=0)
    >>> [[layer for layer, _ in heads] for heads in sets]  # one head of layer 0, two of layer 2, in every set
    [[0, 2, 2], [0, 2, 2]]
    """
    if isinstance(n_draws, bool) or not isinstance(n_draws, int) or n_draws < 1:
        raise GeometryError(f"n_random: expected an integer >= 1 (random head sets per group), got {n_draws!r}")
    counts: dict[int, int] = {}
    for layer, head in group:
        if layer not in available or head not in available[layer]:
            raise GeometryError(f"group: head {layer}.{head} is not among the available heads of layer {layer}")
        counts[layer] = counts.get(layer, 0) + 1
    if len(set(group)) != len(group):
        raise GeometryError(f"group: a head is listed twice in {sorted(group)}")
    generator = torch.Generator().manual_seed(int(seed))
    draws = []
    for _ in range(n_draws):
        chosen: list[Head] = []
        for layer in sorted(counts):
            pool = sorted(int(h) for h in available[layer])
            order = torch.randperm(len(pool), generator=generator)[: counts[layer]]
            chosen += [(layer, pool[int(k)]) for k in order]
        draws.append(tuple(sorted(chosen)))
    return draws


def bootstrap_interval(
    values: Float[Tensor, " document"], n_bootstrap: int, seed: int, level: float = 0.95
) -> tuple[float, float]:
    """Percentile interval of the mean of ``values`` over documents resampled with replacement (seeded)."""
    if values.ndim != 1 or values.numel() < 1:
        raise GeometryError(f"values: expected one value per document, got shape {list(values.shape)}")
    if values.numel() == 1 or n_bootstrap < 1:
        return math.nan, math.nan
    generator = torch.Generator().manual_seed(int(seed))
    picks = torch.randint(values.numel(), (n_bootstrap, values.numel()), generator=generator)
    return percentile_interval(values.detach().double().cpu()[picks].mean(-1), level)


@dataclass(frozen=True)
class AblationRow:
    """One group, task and ablation: the change in loss and what random head sets of its shape do.

    Attributes:
        group, kind: the group's name and kind (role, subtype, detector).
        task: ``"natural"`` (mean next-token NLL on natural-text windows) or
            ``"repeated"`` (mean NLL on the second copy of repeated random tokens).
        ablation: ``"zero"`` or ``"mean"``.
        n_heads: heads in the group; layers: ``"layer:count"`` pairs.
        clean: the clean loss (nats).
        dnll: the group's mean change in loss over documents; low, high its bootstrap interval.
        random_mean, random_sd: mean and standard deviation over the random sets' changes.
        random_low, random_high: the random band, the 5 % and 95 % quantiles over the random sets.
        excess: dnll minus random_mean; excess_low, excess_high its bootstrap interval (documents resampled).
        above_random: the share of random sets whose change is at least the group's.
        n_random: random sets drawn.
    """

    group: str
    kind: str
    task: str
    ablation: str
    n_heads: int
    layers: str
    clean: float
    dnll: float
    low: float
    high: float
    random_mean: float
    random_sd: float
    random_low: float
    random_high: float
    excess: float
    excess_low: float
    excess_high: float
    above_random: float
    n_random: int

    @property
    def verdict(self) -> str:
        """``"above band"``, ``"below band"`` or ``"in band"``: where the group's interval lies against the random band."""
        if self.low > self.random_high:
            return "above band"
        if self.high < self.random_low:
            return "below band"
        return "in band"


def ablation_row(
    group: HeadGroup, task: str, ablation: str, clean: Float[Tensor, " document"],
    ablated: Float[Tensor, " document"], random: Float[Tensor, "draw document"], *, n_bootstrap: int, seed: int,
) -> AblationRow:
    """The row of one group, task and ablation from per-document losses (clean, the group's, each random set's)."""
    delta = (ablated - clean).double().cpu()
    random_delta = (random - clean).double().cpu()  # [draw, document]
    per_draw = random_delta.mean(-1)
    excess_docs = delta - random_delta.mean(0)
    low, high = bootstrap_interval(delta, n_bootstrap, seed)
    excess_low, excess_high = bootstrap_interval(excess_docs, n_bootstrap, seed)
    band = percentile_interval(per_draw, 0.90)  # the 5 % and 95 % quantiles
    dnll = float(delta.mean())
    layers = ", ".join(f"{layer}:{count}" for layer, count in sorted(group.layer_counts().items()))
    return AblationRow(
        group=group.name, kind=group.kind, task=task, ablation=ablation, n_heads=len(group.heads), layers=layers,
        clean=float(clean.double().mean()), dnll=dnll, low=low, high=high,
        random_mean=float(per_draw.mean()), random_sd=float(per_draw.std()) if per_draw.numel() > 1 else math.nan,
        random_low=float(band[0]), random_high=float(band[1]),
        excess=float(excess_docs.mean()), excess_low=excess_low, excess_high=excess_high,
        above_random=float((per_draw >= dnll).double().mean()), n_random=int(per_draw.numel()),
    )


@dataclass(frozen=True, repr=False)  # repr: a summary, not every row (one line of every group's numbers)
class RoleAblation:
    """What ablating each head group costs the model, against random head sets of the same shape.

    Attributes:
        rows: one AblationRow per (group, task, ablation).
        groups: the groups measured.
        model: the model's name.
        settings: the run's sizes and seeds (windows, context, mean windows, prompts, period, draws, bootstrap).
    """

    rows: tuple[AblationRow, ...]
    groups: tuple[HeadGroup, ...]
    model: str = ""
    settings: Mapping[str, Any] = field(default_factory=dict)

    def _summary(self) -> Summary:
        verdicts = [row.verdict for row in self.rows]
        above = [f"{row.group} ({row.task}, {row.ablation})" for row in self.rows if row.verdict == "above band"]
        n_random = max((row.n_random for row in self.rows), default=0)
        rows = (
            ("model", self.model or "-"),
            ("groups", f"{len(self.groups)}: " + names([g.name for g in self.groups], 6)),
            ("rows", f"{plural(len(self.rows), 'row')} (group x task x ablation), each against "
                     f"{plural(n_random, 'random head set')}: {verdicts.count('above band')} above the random band, "
                     f"{verdicts.count('in band')} in it, {verdicts.count('below band')} below"),
            ("above band", names(above, 6) or "none"),
            ("settings", ", ".join(f"{k} {v}" for k, v in self.settings.items()) or "-"),
            ("read", "ablation.to_dataframe(); print(ablation.to_markdown()); "
                     "tl_geometry.interventions.ablation_figure(ablation)"),
        )
        return Summary(f"RoleAblation of {self.model or 'a model'}", rows)

    def __repr__(self) -> str:
        return self._summary().text()

    def _repr_html_(self) -> str:
        return self._summary().html()

    def table(self) -> list[dict[str, Any]]:
        """The rows as dicts (with their verdict against the random band)."""
        out = []
        for row in self.rows:
            item = {f.name: getattr(row, f.name) for f in fields(row)}
            item["verdict"] = row.verdict
            out.append(item)
        return out

    def to_dataframe(self) -> Any:
        """The table as a pandas DataFrame (pandas is needed)."""
        try:
            import pandas as pd
        except ImportError:
            raise GeometryError("to_dataframe: pandas is not installed; pip install pandas, or use .table()") from None
        return pd.DataFrame(self.table())

    def to_markdown(self, *, digits: int = 3) -> str:
        """The table as Markdown: the change in loss with its interval, the random band, the excess."""
        lines = [
            "| group | heads | task | ablation | ΔNLL [95 % CI] | random band 5-95 % (mean ± sd) | excess [95 % CI] | verdict |",
            "|---|---:|---|---|---|---|---|---|",
        ]
        f = f"{{:+.{digits}f}}"
        for row in self.rows:
            lines.append(
                f"| {row.group} | {row.n_heads} | {row.task} | {row.ablation} | {f.format(row.dnll)} "
                f"[{f.format(row.low)}, {f.format(row.high)}] | {f.format(row.random_low)} to {f.format(row.random_high)} "
                f"({f.format(row.random_mean)} ± {row.random_sd:.{digits}f}) | {f.format(row.excess)} "
                f"[{f.format(row.excess_low)}, {f.format(row.excess_high)}] | {row.verdict} |"
            )
        return "\n".join(lines)


@dataclass(frozen=True, repr=False)  # repr: a line per field, not every head's values
class PublishedMeasures:
    """Two published per-head measures beside the roles.

    Attributes:
        layers, heads: the heads measured (axes of the tensors).
        first_token_score: Gu et al.'s importance score of the first token, the
            mean attention on it over the queries that can see it (all of them),
            averaged over sequences, ``[layer, head]``.
        sink_indicator_rate: per head, the share of sequences whose score exceeds epsilon.
        sink_rate: the model's sink rate as Gu et al. compute it: the share of
            (sequence, layer, head) whose score exceeds epsilon (in [0, 1]).
        epsilon: the threshold (theirs: 0.3).
        output_norm: each head's average output norm over all positions ``[layer, head]``.
        norm_ratio: output_norm divided by the mean of its layer's heads.
        dormant_threshold: a head is dormant when norm_ratio is below it.
        space: ``"z"`` (the head's output before W_O) or ``"result"`` (after W_O).
        sequences, length: sequences measured and their length (BOS first).
    """

    layers: tuple[int, ...]
    heads: tuple[int, ...]
    first_token_score: Float[Tensor, "layer head"]
    sink_indicator_rate: Float[Tensor, "layer head"]
    sink_rate: float
    epsilon: float
    output_norm: Float[Tensor, "layer head"]
    norm_ratio: Float[Tensor, "layer head"]
    dormant_threshold: float
    space: str
    sequences: int
    length: int

    def __repr__(self) -> str:
        return field_summary(self, "measures.crosstab(roles); measures.sink_heads, .dormant_heads are [layer, head]").text()

    def _repr_html_(self) -> str:
        return field_summary(self, "measures.crosstab(roles); measures.sink_heads, .dormant_heads are [layer, head]").html()

    @property
    def sink_heads(self) -> torch.Tensor:
        """Heads whose mean first-token score (over sequences) exceeds epsilon, ``[layer, head]`` bool."""
        return self.first_token_score > self.epsilon

    @property
    def dormant_heads(self) -> torch.Tensor:
        """Heads whose average output norm is below ``dormant_threshold`` of their layer's mean, ``[layer, head]`` bool."""
        return self.norm_ratio < self.dormant_threshold

    def crosstab(self, roles: Any) -> dict[str, dict[str, int]]:
        """Counts of each role label among all heads, sink heads and dormant heads.

        The roles must cover the same layers and heads.
        Returns ``{"all": {label: n}, "sink": {...}, "dormant": {...}}`` (every label of ROLE_LABELS).
        """
        _check_roles(roles)
        if tuple(roles.layers) != self.layers or tuple(roles.heads) != self.heads:
            raise GeometryError(
                f"roles: covers layers {list(roles.layers)} and heads {list(roles.heads)}, the measures "
                f"{list(self.layers)} and {list(self.heads)}; measure the heads the roles classified"
            )
        names = roles.label_names()
        out = {key: {label: 0 for label in ROLE_LABELS} for key in ("all", "sink", "dormant")}
        sink, dormant = self.sink_heads.tolist(), self.dormant_heads.tolist()
        for i in range(len(self.layers)):
            for j in range(len(self.heads)):
                label = names[i][j]
                out["all"][label] += 1
                out["sink"][label] += int(sink[i][j])
                out["dormant"][label] += int(dormant[i][j])
        return out
