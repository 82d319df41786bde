"""From sweep results only: the effective set size N*_tau, and geometry against function (Spearman).

N*_tau, the smallest N whose relative dNLL is at most tau, is found as the
follow-up protocol does, by `search_n_star` on an oracle ``f(N)``:

1. powers of two 1, 2, 4, ... up to ``max_n`` (``max_n`` itself included)
   until one passes (``f(N) <= tau``); none: N*_tau is not reached (NaN);
2. bisection between the last failing power and the first passing one;
3. a search within +-3 of the bisection's answer: the smallest passing N there.

The bootstrap interval: in every replicate, the smallest N *among those the
search evaluated* whose replicate relative dNLL is at most tau (the grid is
dense where the point estimate lies, coarse elsewhere); percentiles of those
(+inf where a replicate never passes; replicates whose weights leave no
document are left out).

Spearman correlations rank with average ranks for ties; units with a NaN on
either side are left out. Bootstrap intervals pair replicate b of the
geometry result with replicate b of the sweep: both draw their Poisson
weights from the same hash of each document's tokens and the seed, so run
both on the same windows with the same seed and ``n_bootstrap``.
"""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from tl_geometry.analysis.correlation import spearman
from tl_geometry.diagnostics.selection import F_SCORE
from tl_geometry.errors import GeometryError
from tl_geometry.results.display import field_summary
from tl_geometry.results.intervention_result import ALL, InterventionResult
from tl_geometry.results.result import GeometryResult
from tl_geometry.results.select import nanquantile
from tl_geometry.results.table import FieldName, field_name

DEFAULT_TAUS = (0.01, 0.05, 0.10)


class NeedsN(Exception):
    """Raised by a search oracle for an N it has not measured yet (the driver measures it and searches again)."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.n = n


def search_n_star(f: Callable[[int], float], tau: float, max_n: int) -> int | None:
    """The protocol's search for the smallest N with ``f(N) <= tau`` (None: no N up to ``max_n`` passes).

    >>> curve = {n: 1.0 / n for n in range(1, 65)}
    >>> search_n_star(curve.__getitem__, 0.05, 64)  # 1/N <= 0.05 from N = 20
    20
    """
    if max_n < 1:
        raise GeometryError(f"max_n: expected a positive integer, got {max_n}")
    powers = []
    p = 1
    while p < max_n:
        powers.append(p)
        p *= 2
    powers.append(max_n)
    previous = 0
    for p in powers:
        if f(p) <= tau:
            break
        previous = p
    else:
        return None
    lo, hi = previous, p  # f(lo) > tau (or lo = 0), f(hi) <= tau
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if f(mid) <= tau:
            hi = mid
        else:
            lo = mid
    for n in range(max(1, hi - 3), min(max_n, hi + 3) + 1):
        if f(n) <= tau:
            return n
    return hi


def curve_oracle(grid: Sequence[int], values: Sequence[float]) -> Callable[[int], float]:
    """An oracle reading a measured curve; `NeedsN` for an N not on it. NaN never passes."""
    table = dict(zip((int(n) for n in grid), (float(v) for v in values)))

    def f(n: int) -> float:
        if n not in table:
            raise NeedsN(n)
        value = table[n]
        return math.inf if math.isnan(value) else value

    return f


@dataclass(frozen=True)
class EffectiveSetSize:
    """N*_tau per scope unit, with its bootstrap interval.

    Attributes:
        taus: the tolerances (relative dNLL), ``[tau]``.
        layers, heads: unit labels of the sweep (-1: all).
        n_star: ``[tau, layer, head_index]`` (NaN: no N up to ``max_n`` passes).
        low, high: the percentile interval, same shape (+inf: replicates that never pass).
        replicates: ``[replicate, tau, layer, head_index]`` (+inf: never passes).
        mode: the intervention mode.
        max_n: the largest N searched.
        sweeps: the sweep of every unit the search built (every N it evaluated), in unit order.
    """

    taus: tuple[float, ...]
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    n_star: Float[Tensor, "tau layer head_index"]
    low: Float[Tensor, "tau layer head_index"]
    high: Float[Tensor, "tau layer head_index"]
    replicates: Float[Tensor, "replicate tau layer head_index"]
    mode: str
    max_n: int
    sweeps: tuple[InterventionResult, ...]

    def __repr__(self) -> str:  # a line per field, not every replicate
        return field_summary(self, 'n_star.sel(0.05, layer=..., head=...); n_star.n_star is [tau, layer, head]').text()

    def _repr_html_(self) -> str:
        return field_summary(self, 'n_star.sel(0.05, layer=..., head=...); n_star.n_star is [tau, layer, head]').html()

    def sel(self, tau: float = 0.05, *, layer: int | None = None, head: int | None = None) -> Tensor:
        """N*_tau by unit labels (-1: the all-layer / all-head unit)."""
        from tl_geometry.results.select import take

        if tau not in self.taus:
            raise GeometryError(f"tau: {tau} was not searched; taus are {list(self.taus)}")
        t = self.n_star[self.taus.index(tau)]
        return take(take(t, 1, "head", self.heads, head), 0, "layer", self.layers, layer)


def stack_n_star(parts: Sequence[EffectiveSetSize], layers: Sequence[int], heads: Sequence[int]) -> EffectiveSetSize:
    """One EffectiveSetSize from per-unit ones (each 1 x 1), laid out on ``[layer, head_index]`` in row order."""
    first = parts[0]
    if len(parts) != len(layers) * len(heads):
        raise GeometryError(f"stack_n_star: {len(parts)} parts for {len(layers)} x {len(heads)} units")

    def grid(name: str) -> Tensor:
        t = torch.stack([getattr(p, name)[..., 0, 0] for p in parts], dim=-1)
        return t.reshape(*t.shape[:-1], len(layers), len(heads))

    n_reps = min(len(p.replicates) for p in parts)
    replicates = torch.stack([p.replicates[:n_reps, :, 0, 0] for p in parts], dim=-1)
    return EffectiveSetSize(taus=first.taus, layers=tuple(layers), heads=tuple(heads), n_star=grid("n_star"),
                            low=grid("low"), high=grid("high"),
                            replicates=replicates.reshape(n_reps, len(first.taus), len(layers), len(heads)),
                            mode=first.mode, max_n=first.max_n, sweeps=tuple(s for p in parts for s in p.sweeps))


def n_star_needs(sweep: InterventionResult, mode: str, taus: Sequence[float], max_n: int) -> set[int]:
    """The N values the search still needs on this sweep (empty: every unit's N*_tau is found)."""
    rel = sweep.relative(mode)
    grid = sweep.n_grid.tolist()
    needs: set[int] = set()
    for tau in taus:
        for i in range(rel.shape[0]):
            for j in range(rel.shape[1]):
                try:
                    search_n_star(curve_oracle(grid, rel[i, j].tolist()), tau, max_n)
                except NeedsN as need:
                    needs.add(need.n)
    return needs


def n_star_of(sweep: InterventionResult, mode: str, taus: Sequence[float], max_n: int, level: float = 0.95) -> EffectiveSetSize:
    """N*_tau of every unit from a sweep that holds every N the search needs (see `n_star_needs`)."""
    missing = n_star_needs(sweep, mode, taus, max_n)
    if missing:
        raise GeometryError(f"n_star_of: the sweep lacks N = {sorted(missing)} that the search needs; run "
                            "tl_geometry.interventions.effective_set_size, which measures them")
    rel = sweep.relative(mode)
    grid = sweep.n_grid.tolist()
    shape = (len(taus), *rel.shape[:2])
    n_star = torch.full(shape, math.nan, dtype=torch.float64)
    for t, tau in enumerate(taus):
        for i in range(rel.shape[0]):
            for j in range(rel.shape[1]):
                found = search_n_star(curve_oracle(grid, rel[i, j].tolist()), tau, max_n)
                n_star[t, i, j] = math.nan if found is None else found
    if sweep.n_bootstrap:
        reps = sweep.replicates(mode, relative=True)  # [replicate, layer, head, n]
        grid_t = sweep.n_grid.double()
        passing = torch.stack([reps <= tau for tau in taus], dim=1)  # [replicate, tau, layer, head, n]
        candidates = torch.where(passing, grid_t, math.inf)
        # A replicate whose weights leave no document (all NaN) has no N*: NaN, left out of the interval.
        empty = reps.isnan().all(-1)[:, None].expand(candidates.shape[:-1])
        replicates = candidates.amin(-1).masked_fill(empty, math.nan)
        tail = (1 - level) / 2
        low, high = nanquantile(replicates, tail), nanquantile(replicates, 1 - tail)
    else:
        replicates = torch.zeros((0, *shape), dtype=torch.float64)
        low = high = torch.full(shape, math.nan, dtype=torch.float64)
    return EffectiveSetSize(taus=tuple(float(t) for t in taus), layers=sweep.layers, heads=sweep.heads, n_star=n_star,
                            low=low, high=high, replicates=replicates, mode=mode, max_n=max_n, sweeps=(sweep,))


@dataclass(frozen=True)
class GeometryFunctionCorrelation:
    """Spearman correlation across units between a geometric field and dNLL, per N.

    Attributes:
        field: the geometric field (e.g. ``"f_score"``, ``"precision"``, ``"recall"``).
        mode: the intervention mode.
        n_grid: the N values both results share, ``[n]``.
        rho: Spearman's rho across units, ``[n]``.
        low, high: percentile bootstrap interval, ``[n]`` (NaN without replicates).
        x, y: the per-unit values correlated, ``[unit, n]`` (the figure's scatter).
        units: (layer, head) of each unit.
    """

    field: str
    mode: str
    n_grid: Tensor
    rho: Tensor
    low: Tensor
    high: Tensor
    x: Tensor
    y: Tensor
    units: tuple[tuple[int, int], ...]

    def why_undefined(self, k: int) -> str | None:
        """Why ``rho[k]`` is NaN, in words (None where it is defined): Spearman needs 3 units with both values, and
        neither variable the same for every unit (as at an N that selects every key, where P = R = 1)."""
        if not math.isnan(float(self.rho[k])):
            return None
        both = ~(self.x[:, k].isnan() | self.y[:, k].isnan())
        count = int(both.sum())
        if count < 3:
            return f"{count} of {len(self.units)} units have both values, 3 needed"
        constant = [name for name, v in ((self.field, self.x[both, k]), ("dNLL", self.y[both, k]))
                    if bool((v == v[0]).all())]
        return f"{' and '.join(constant) or 'one variable'} (nearly) the same for every unit"

    def __repr__(self) -> str:  # a line per field, not every unit's values
        return field_summary(self, "correlation.rho is [n]; correlation.x and .y the units' values").text()

    def _repr_html_(self) -> str:
        return field_summary(self, "correlation.rho is [n]; correlation.x and .y the units' values").html()


def _unit_geometry(geometry: Tensor, geometry_layers: Sequence[int], geometry_heads: Sequence[int],
                   sweep: "InterventionResult | EffectiveSetSize") -> tuple[Tensor, list[tuple[int, int]]]:
    """The geometric field per sweep unit, ``[..., unit, n]``: a head's own, or a layer's mean over its heads."""
    rows, units = [], []
    for layer in sweep.layers:
        if layer == ALL or layer not in geometry_layers:
            raise GeometryError(f"correlation: sweep unit layer {layer} is not among the geometry's layers "
                                f"{list(geometry_layers)}; use a layer- or head-scope sweep over analysed layers")
        li = list(geometry_layers).index(layer)
        for head in sweep.heads:
            if head == ALL:
                rows.append(geometry[..., li, :, :].nanmean(-2))
            else:
                if head not in geometry_heads:
                    raise GeometryError(f"correlation: head {head} was not analysed by the geometry run")
                rows.append(geometry[..., li, list(geometry_heads).index(head), :])
            units.append((layer, head))
    return torch.stack(rows, dim=-2), units


def geometry_vs_dnll(geometry: GeometryResult, sweep: InterventionResult, *, field: FieldName = F_SCORE,
                     mode: str = "renormalise", relative: bool = False,
                     level: float = 0.95) -> GeometryFunctionCorrelation:
    """Spearman, across the sweep's units (heads or layers), of a geometric field against dNLL at the same N.

    Args:
        geometry: a `tl_geometry.GeometryResult` over the same windows (for
            intervals, with the field among its bootstrap fields, the same seed and ``n_bootstrap``).
        sweep: a layer- or head-scope `InterventionResult`.
        field: ``"f_score"`` (F_N), ``"precision"``, ``"recall"`` or any ``[layer, head_index, n]`` field.
        mode: the intervention mode.
        relative: correlate relative rather than absolute dNLL (the ranks are the same).
        level: coverage of the interval.

    Returns:
        GeometryFunctionCorrelation over the N values both grids share.
    """
    shared = [n for n in sweep.n_grid.tolist() if n in geometry.n_grid.tolist()]
    if not shared:
        raise GeometryError(f"correlation: no N in common between the geometry grid {geometry.n_grid.tolist()} and "
                            f"the sweep grid {sweep.n_grid.tolist()}")
    if geometry.spec(field).axes != ("n",):
        raise GeometryError(
            f"correlation: field {field_name(field)!r} has axes {geometry.spec(field).axes}, expected ('n',)"
        )
    g_index = torch.tensor([geometry.n_grid.tolist().index(n) for n in shared])
    s_index = torch.tensor([sweep.n_grid.tolist().index(n) for n in shared])
    x, units = _unit_geometry(geometry.per_head(field).index_select(-1, g_index), geometry.layers, geometry.heads, sweep)
    y_full = sweep.relative(mode) if relative else sweep.dnll(mode)
    y = y_full.index_select(-1, s_index).reshape(-1, len(shared))
    rho = spearman(x.T, y.T)
    low = high = torch.full_like(rho, math.nan)
    if sweep.n_bootstrap and geometry.has_replicates(field):
        if geometry.n_bootstrap != sweep.n_bootstrap or geometry.n_documents != sweep.n_documents:
            raise GeometryError(
                f"correlation: the geometry run ({geometry.n_documents} documents, {geometry.n_bootstrap} replicates) "
                f"and the sweep ({sweep.n_documents}, {sweep.n_bootstrap}) do not pair; run both on the same windows "
                "with the same seed and n_bootstrap"
            )
        gx, _ = _unit_geometry(geometry.replicates(field).index_select(-1, g_index), geometry.layers, geometry.heads, sweep)
        gy = sweep.replicates(mode, relative=relative).index_select(-1, s_index)
        gy = gy.reshape(gy.shape[0], -1, len(shared))
        reps = spearman(gx.transpose(-1, -2), gy.transpose(-1, -2))  # [replicate, n]
        tail = (1 - level) / 2
        low, high = nanquantile(reps, tail), nanquantile(reps, 1 - tail)
    return GeometryFunctionCorrelation(field=field_name(field), mode=mode, n_grid=torch.tensor(shared), rho=rho, low=low,
                                       high=high, x=x, y=y, units=tuple(units))


def n_star_vs_geometry(geometry: GeometryResult, n_star: EffectiveSetSize, *, field: FieldName = F_SCORE, n: int,
                       tau: float = 0.05, level: float = 0.95) -> tuple[float, float, float]:
    """Spearman across units of N*_tau against a geometric field at one N: ``(rho, low, high)``.

    Units whose N*_tau is not reached are left out (NaN); intervals pair replicates as `geometry_vs_dnll`.
    """
    if tau not in n_star.taus:
        raise GeometryError(f"tau: {tau} was not searched; this N*_tau has taus {list(n_star.taus)}")
    t = n_star.taus.index(tau)
    g = geometry.per_head(field)[..., geometry.n_grid.tolist().index(n)] if n in geometry.n_grid.tolist() else None
    if g is None:
        raise GeometryError(f"n: {n} is not on the geometry grid {geometry.n_grid.tolist()}")
    x, _ = _unit_geometry(g[..., None], geometry.layers, geometry.heads, n_star)
    rho = float(spearman(x[:, 0], n_star.n_star[t].reshape(-1)))
    low = high = math.nan
    if len(n_star.replicates) and geometry.has_replicates(field):
        gx, _ = _unit_geometry(geometry.replicates(field)[..., geometry.n_grid.tolist().index(n)][..., None],
                               geometry.layers, geometry.heads, n_star)
        y = n_star.replicates[:, t].reshape(len(n_star.replicates), -1)
        reps = spearman(gx[..., 0], y.masked_fill(y.isinf(), math.nan))
        tail = (1 - level) / 2
        low, high = float(nanquantile(reps, tail)), float(nanquantile(reps, 1 - tail))
    return rho, low, high


@dataclass(frozen=True)
class DnllCurve:
    """dNLL against N for one unit and mode: the mean, its bootstrap interval, and the random controls' band.

    Lists over ``n``; intervals None without replicates, control entries None without controls
    (the band is the min..max over controls of their means).
    """

    n: list
    mean: list
    low: list | None
    high: list | None
    control_mean: list | None
    control_low: list | None
    control_high: list | None


def dnll_curve(sweep: InterventionResult, mode: str, *, layer: int = ALL, head: int = ALL,
               relative: bool = False, level: float = 0.95) -> DnllCurve:
    """The curve of one unit (labels as on the sweep; -1 for the all-layer / all-head unit)."""
    from tl_geometry.results.select import take

    def pick(t: Tensor) -> list:
        return take(take(t, 1, "head", sweep.heads, head), 0, "layer", sweep.layers, layer).tolist()

    mean = pick(sweep.relative(mode) if relative else sweep.dnll(mode))
    low = high = None
    if sweep.n_bootstrap:
        lo, hi = sweep.ci(mode, relative=relative, level=level)
        low, high = pick(lo), pick(hi)
    c_mean = c_low = c_high = None
    if sweep.n_controls:
        controls = sweep.controls(mode)
        if relative:
            controls = controls / sweep.stats["nll_clean"].mean()[..., None, None]
        c_mean = pick(controls.mean(-1))
        c_low, c_high = pick(controls.amin(-1)), pick(controls.amax(-1))
    return DnllCurve(n=sweep.n_grid.tolist(), mean=mean, low=low, high=high, control_mean=c_mean,
                     control_low=c_low, control_high=c_high)
