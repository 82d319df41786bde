"""InterventionResult: the NLL changes of a top-N intervention sweep, mergeable and saved like a GeometryResult.

Axes: every field is ``[layer, head_index, *trailing]`` as on a
`GeometryResult`, where the leading axes name the *scope units* of the sweep:

- ``scope="model"``: one unit, layer -1 and head -1 (every intervened layer and head at once);
- ``scope="layer"``: one unit per layer, head -1 (every intervened head of that layer);
- ``scope="head"``: one unit per (layer, head).

Fields (per document = window: the mean next-token NLL over its predicted tokens):

- ``nll_clean``: the clean pass's NLL (the same for every unit);
- ``dnll_<mode>`` ``[..., n]``: intervened NLL minus clean NLL, top-N by the sweep's ranking;
- ``dnll_<mode>_random`` ``[..., n, control]``: the same for each random control;
- ``dnll_<mode>_random_mean`` ``[..., n]``: its mean over the controls.

Relative dNLL is the ratio of corpus means, mean dNLL / mean clean NLL (and
per bootstrap replicate the ratio of the replicate means, the two fields
weighted by the same documents). Statistics are the exact, mergeable
`FieldStats` of `tl_geometry.results.stats`; files are the same pair
``<stem>.npz`` / ``<stem>.json`` (``"kind": "interventions"`` in the JSON).
"""

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.errors import GeometryError
from tl_geometry.results.display import Summary, names, plural, ranges, short_list
from tl_geometry.results.fileformat import (
    FORMAT_VERSION,
    array_limits,
    check_checksum,
    malformed_as_error,
    non_negative_int,
    of_json_type,
    open_pair,
    paths,
    read_stats,
    read_versions,
)
from tl_geometry.atomic_io import commit_unit, json_text
from tl_geometry.results.stats import FieldStats
from tl_geometry.results.table import StatisticsTable, check_level, percentile_ci
from tl_geometry.results.storage import read_npz, sha256, stats_arrays

ALL = -1
"""Label of the layer or head axis of a unit that covers every intervened layer or head."""
KIND = "interventions"
CLEAN_FIELD = FieldSpec("nll_clean", "mean next-token NLL of the clean pass (nats)", bootstrap=True)


def _labels(meta: Mapping[str, Any], key: str) -> tuple[int, ...]:
    """Layer or head labels from a sweep's JSON: integers, `ALL` (-1) for a unit that covers them all."""
    values = of_json_type(meta[key], list, key)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= ALL for v in values):
        raise GeometryError(f"{key!r} is {values!r}, expected layer or head numbers (or {ALL} for all of them)")
    return tuple(values)


def dnll_spec(mode: str) -> FieldSpec:
    """The field of dNLL under the sweep's ranking for one mode, ``[layer, head_index, n]``."""
    return FieldSpec(f"dnll_{mode}", f"NLL(top-N, {mode}) - NLL(clean), nats", axes=("n",), bootstrap=True)


def control_spec(mode: str) -> FieldSpec:
    """The field of dNLL of every random control for one mode, ``[layer, head_index, n, control]``."""
    return FieldSpec(f"dnll_{mode}_random", f"NLL(random top-N, {mode}) - NLL(clean), per control",
                     axes=("n", "control"))


def control_mean_spec(mode: str) -> FieldSpec:
    """The field of dNLL averaged over the random controls for one mode, ``[layer, head_index, n]``."""
    return FieldSpec(f"dnll_{mode}_random_mean", f"NLL(random top-N, {mode}) - NLL(clean), mean over controls",
                     axes=("n",), bootstrap=True)


def sweep_specs(modes: Sequence[str], n_controls: int) -> list[FieldSpec]:
    """Every field a sweep with these modes and controls measures."""
    specs = [CLEAN_FIELD]
    for mode in modes:
        specs.append(dnll_spec(mode))
        if n_controls:
            specs += [control_spec(mode), control_mean_spec(mode)]
    return specs


@dataclass(frozen=True, repr=False)  # repr: a summary (StatisticsTable.__repr__), not every replicate
class InterventionResult(StatisticsTable):
    """dNLL statistics of a top-N sweep over documents, per scope unit, mode, N and control.

    Attributes:
        n_grid: the N values, ``[n]``.
        layers, heads: labels of the unit axes (-1: every intervened layer / head).
        stats: field name -> `FieldStats`.
        scope: ``"model"``, ``"layer"`` or ``"head"``.
        modes: the modes measured.
        ranking: the ranking of the top-N sets (``"attention"`` or ``"contribution"``).
        n_controls: random controls per setting (0: none).
        intervened_layers, intervened_heads: what the units cut (heads None: all).
        n_documents, n_tokens: documents (windows) and their real tokens.
        seed: seed of the random controls and the bootstrap weights.
        model_name, versions: provenance.
    """

    scope: str
    modes: tuple[str, ...]
    ranking: str
    n_controls: int
    intervened_layers: tuple[int, ...]
    intervened_heads: tuple[int, ...] | None
    seed: int
    model_name: str
    versions: Mapping[str, str]
    kind: ClassVar[str] = "sweep"

    # ---- reading ----

    def _check_mode(self, mode: str) -> None:
        if mode not in self.modes:
            raise GeometryError(f"mode: {mode!r} was not measured; this sweep has modes {list(self.modes)}")

    def nll_clean(self) -> float:
        """Mean clean NLL over documents (nats)."""
        return float(self._stats(CLEAN_FIELD.name).mean().flatten()[0])

    def dnll(self, mode: str, *, control: bool = False) -> Float[Tensor, "layer head_index n"]:
        """Mean dNLL over documents, ``[layer, head_index, n]`` (``control=True``: mean of the random controls)."""
        self._check_mode(mode)
        return self._stats((control_mean_spec if control else dnll_spec)(mode).name).mean()

    def controls(self, mode: str) -> Float[Tensor, "layer head_index n control"]:
        """Mean dNLL of every random control, ``[layer, head_index, n, control]``."""
        self._check_mode(mode)
        return self._stats(control_spec(mode).name).mean()

    def relative(self, mode: str, *, control: bool = False) -> Float[Tensor, "layer head_index n"]:
        """Relative dNLL: mean dNLL / mean clean NLL, ``[layer, head_index, n]``."""
        return self.dnll(mode, control=control) / self._stats(CLEAN_FIELD.name).mean()[..., None]

    def replicates(self, mode: str, *, relative: bool = False, control: bool = False) -> Float[Tensor, "replicate layer head_index n"]:
        """Bootstrap replicate means of dNLL (or relative dNLL), ``[replicate, layer, head_index, n]``."""
        self._check_mode(mode)
        keep = "run the sweep with n_bootstrap > 0"
        out = self._replicate_means((control_mean_spec if control else dnll_spec)(mode).name, keep)
        if relative:
            out = out / self._replicate_means(CLEAN_FIELD.name, keep)[..., None]
        return out

    def ci(self, what: str, *, relative: bool = False, control: bool = False,
           level: float = 0.95) -> tuple[Tensor, Tensor]:
        """Percentile bootstrap interval, ``(low, high)`` each ``[layer, head_index, ...]``.

        Args:
            what: a mode (the interval of its mean dNLL, or of the relative
                dNLL, or of the controls' mean dNLL, ``[layer, head_index, n]``)
                or a field that keeps replicates (``"nll_clean"``,
                ``"dnll_delete"``, ...), as `GeometryResult.ci` reads a field.
            relative: for a mode only: the interval of the relative dNLL.
            control: for a mode only: the interval of the controls' mean dNLL.
            level: coverage in (0, 1).
        """
        check_level(level)
        if what in self.stats:
            self._no_mode_options(what, relative, control)
            return percentile_ci(self._replicate_means(what, "run the sweep with n_bootstrap > 0"), level)
        return percentile_ci(self.replicates(what, relative=relative, control=control), level)

    def sel(self, what: str, *, layer: int | Sequence[int] | None = None, head: int | Sequence[int] | None = None,
            n: int | Sequence[int] | None = None, relative: bool = False, control: bool = False,
            stat: str = "mean") -> Tensor:
        """A statistic indexed by layer label, head label and N value (-1: the all-layer/head unit).

        Args:
            what: a mode (its mean dNLL, relative with ``relative=True``, of
                the random controls with ``control=True``) or a field name
                (``"nll_clean"``, ``"dnll_delete_random"``, ...; ``stat``
                ``"mean"``, ``"std"`` or ``"count"``), as `GeometryResult.sel`.
            layer: a layer label (drops the axis), a list of them (keeps it), or None (all).
            head: a head label, a list of them, or None, likewise.
            n: an N value of the grid, a list of them, or None, likewise.
            relative: for a mode: the relative dNLL (dNLL / clean NLL).
            control: for a mode: the mean dNLL of the random controls.
            stat: for a field: ``"mean"``, ``"std"`` or ``"count"``.

        Example: ``sweep.sel("delete", layer=-1, head=-1, n=4)`` is 0-d;
        ``sweep.sel("dnll_delete_random", n=4)`` is ``[layer, head_index, control]``.
        """
        if what in self.stats:
            self._no_mode_options(what, relative, control)
            getter = {"mean": self.per_head, "std": self.std, "count": self.count}
            if stat not in getter:
                raise GeometryError(f"stat: expected one of {tuple(getter)}, got {stat!r}")
            return self._select(getter[stat](what), self.spec(what).axes, layer, head, n)
        if stat != "mean":
            raise GeometryError(f"stat: a mode gives the mean dNLL; for {stat!r} name a field, e.g. "
                                f"sweep.sel({dnll_spec(what).name!r}, stat={stat!r})")
        t = self.relative(what, control=control) if relative else self.dnll(what, control=control)
        return self._select(t, ("n",), layer, head, n)

    def _no_mode_options(self, name: str, relative: bool, control: bool) -> None:
        if relative or control:
            raise GeometryError(f"{name!r} is a field: relative= and control= apply to a mode {list(self.modes)}; "
                                "name the field you want instead (e.g. 'dnll_delete_random_mean')")

    def to_dataframe(self, fields: Sequence[str] | str | None = None, n: Sequence[int] | int | None = None, *,
                     form: str = "summary", level: float = 0.95) -> Any:
        """A pandas table of the statistics: by default a summary a person reads, ``form="long"`` every statistic.

        ``form="summary"``: one row per scope unit and N (every N of the
        sweep's grid by default), columns layer, head, n (layer or head -1: the
        unit of every layer or head), then per mode its mean dNLL
        (``dnll_<mode>``) and, with random controls, their mean
        (``dnll_<mode>_random_mean``), each with ``_ci_low`` / ``_ci_high``
        where it kept bootstrap replicates. ``form="long"``: one row per
        statistic, columns field, layer, head, n, control, mean, std, count,
        ci_low, ci_high (control NaN for fields without one), every field and
        N by default. As `GeometryResult.to_dataframe`; see `tl_geometry.results.dataframe`.

        Args:
            fields: the fields (summary: default each mode's dNLL and control mean; long: default all).
            n: the N values (default every N of the grid).
            form: ``"summary"`` or ``"long"``.
            level: coverage of the bootstrap intervals.

        >>> sweep.to_dataframe()  # doctest: +SKIP
        >>> sweep.to_dataframe(["dnll_delete", "nll_clean"], n=[1, 4])  # doctest: +SKIP
        >>> sweep.to_dataframe(form="long")  # doctest: +SKIP
        """
        from tl_geometry.results.dataframe import check_form, summary_dataframe, to_dataframe

        check_form(form)
        if form == "summary":
            shown = [spec.name for mode in self.modes
                     for spec in ((dnll_spec(mode), control_mean_spec(mode)) if self.n_controls else (dnll_spec(mode),))]
            return summary_dataframe(self, fields, n, level, default_fields=shown, default_n=None)
        return to_dataframe(self, fields, level, axis_columns=("n", "control"), n=n)

    def describe(self) -> str:
        """A few lines: scope, units, grid, documents, clean NLL and fields."""
        lines = [
            (f"{self.model_name}: top-N sweep, scope={self.scope!r}, ranking={self.ranking!r}, modes={list(self.modes)}, "
             f"{self.n_controls} random controls; {len(self.layers)} x {len(self.heads)} units, N = {self.n_grid.tolist()}"),
            f"  {plural(self.n_documents, 'document')}, {plural(self.n_tokens, 'token')}, "
            f"clean NLL {self.nll_clean():.4f} nats",
        ]
        lines += [f"  {name} [{', '.join(('layer', 'head_index', *s.spec.axes))}]: {s.spec.doc}" for name, s in self.stats.items()]
        return "\n".join(lines)

    def _summary(self) -> Summary:
        def labels(values: tuple[int, ...], what: str) -> str:
            return f"all {what}s at once" if values == (ALL,) else f"{what}s {ranges(values)}"

        heads = "all heads" if self.intervened_heads is None else f"heads {ranges(self.intervened_heads)}"
        mode, layer, head = self.modes[0], self.layers[0], self.heads[0]
        n = int(self.n_grid[0])
        units = len(self.layers) * len(self.heads)
        rows = [
            ("model", self.model_name),
            ("sample", f"{plural(self.n_documents, 'document')}, {plural(self.n_tokens, 'token')}; "
                       f"clean NLL {self.nll_clean():.4f} nats"),
            ("sweep", f"scope={self.scope!r}, ranking={self.ranking!r}, modes={list(self.modes)}, "
                      f"{plural(self.n_controls, 'random control')}, seed {self.seed}"),
            ("units", f"{plural(units, 'unit')}: {labels(self.layers, 'layer')} x {labels(self.heads, 'head')}"),
            ("intervened", f"layers {ranges(self.intervened_layers)}; {heads}"),
            ("N grid", f"{plural(len(self.n_grid), 'value')}: {short_list(self.n_grid.tolist())}"),
            ("fields", f"{len(self.stats)}: " + names(list(self.stats), 6, "result.describe()")),
            ("bootstrap", f"{self.n_bootstrap} replicates (result.ci)" if self.n_bootstrap else
                          "none (n_bootstrap=0: no intervals)"),
            ("read", f"result.sel({mode!r}, layer={layer}, head={head}, n={n}); result.dnll({mode!r}) is "
                     f"[layer, head, n]; result.relative({mode!r}); result.to_dataframe()"),
            ("next", "tl_geometry.interventions.effective_set_size; result.save(path)"),
        ]
        return Summary(f"InterventionResult of {self.model_name}", tuple(rows))

    # ---- merging and joining ----

    def _settings(self) -> dict[str, Any]:
        return {"layers": self.layers, "heads": self.heads, "scope": self.scope, "modes": self.modes,
                "ranking": self.ranking, "n_controls": self.n_controls, "intervened_layers": self.intervened_layers,
                "intervened_heads": self.intervened_heads, "seed": self.seed, "n_bootstrap": self.n_bootstrap}

    def merge(self, other: "InterventionResult") -> "InterventionResult":
        """The sweep over the documents of both (disjoint documents, same settings and grid)."""
        settings = {k: (v, other._settings()[k]) for k, v in self._settings().items()}
        self._check_mergeable(other, settings, "merge", "only sweeps with one setting merge")
        return replace(self, **self._merged_stats([other]))

    def join_n(self, other: "InterventionResult") -> "InterventionResult":
        """The same documents measured at the N of both grids (sorted; an N in both is taken from ``self``).

        Used by the N*_tau search, which adds N values to a sweep as it goes.

        Raises:
            GeometryError: different settings, or not the same documents (clean NLL statistics differ).
        """
        for what, (mine, theirs) in {k: (v, other._settings()[k]) for k, v in self._settings().items()}.items():
            if mine != theirs:
                raise GeometryError(f"join_n: the sweeps differ in {what} ({mine!r} vs {theirs!r})")
        a, b = self.stats[CLEAN_FIELD.name], other.stats[CLEAN_FIELD.name]
        if self.n_documents != other.n_documents or not torch.equal(a.count, b.count) or not torch.allclose(a.total, b.total):
            raise GeometryError("join_n: the sweeps did not measure the same documents (clean NLL differs); run both on one corpus")
        mine, theirs = self.n_grid.tolist(), other.n_grid.tolist()
        extra = [i for i, n in enumerate(theirs) if n not in mine]
        grid = torch.tensor(mine + [theirs[i] for i in extra], dtype=torch.long)
        order = torch.argsort(grid)
        stats = {}
        for name, s in self.stats.items():
            if "n" not in s.spec.axes:
                stats[name] = s
                continue
            t = other.stats[name]
            parts = {}
            for statistic, x in s.arrays().items():
                axis = x.ndim - len(s.spec.axes) + s.spec.axes.index("n")
                y = t.arrays()[statistic].index_select(axis, torch.tensor(extra, dtype=torch.long))
                parts[statistic] = torch.cat([x, y], dim=axis).index_select(axis, order)
            stats[name] = FieldStats(spec=s.spec, **parts)
        return replace(self, n_grid=grid[order], stats=stats)

    # ---- files ----

    def save(self, path: str | os.PathLike) -> tuple[Path, Path]:
        """Write ``<path>.npz`` and ``<path>.json`` as one unit (no pickle; see `tl_geometry.atomic_io`)."""
        npz_path, json_path = paths(path)
        arrays: dict[str, np.ndarray] = {"n_grid": self.n_grid.numpy()}
        for s in self.stats.values():
            arrays.update(stats_arrays(s.stored()))
        with commit_unit(npz_path.parent) as unit:
            unit.write(npz_path, lambda f: np.savez(f, **arrays))
            unit.write(json_path, lambda f: f.write(self._metadata(sha256(unit.staged[npz_path])).encode()))
        return npz_path, json_path

    def _metadata(self, npz_sha256: str) -> str:
        """The JSON side of a saved sweep."""
        meta = {
            "format_version": FORMAT_VERSION, "kind": KIND, "model_name": self.model_name,
            "layers": list(self.layers), "heads": list(self.heads), "scope": self.scope, "modes": list(self.modes),
            "ranking": self.ranking, "n_controls": self.n_controls, "intervened_layers": list(self.intervened_layers),
            "intervened_heads": None if self.intervened_heads is None else list(self.intervened_heads),
            "n_documents": self.n_documents, "n_tokens": self.n_tokens, "seed": self.seed,
            "versions": dict(self.versions),
            "fields": [{"name": s.spec.name, "doc": s.spec.doc, "axes": list(s.spec.axes), "queries": s.spec.queries,
                        "documents": s.spec.documents, "bootstrap": s.spec.bootstrap, "trailing": list(s.trailing),
                        "replicates": s.n_replicates} for s in self.stats.values()],
            "npz_sha256": npz_sha256,
        }
        return json_text(meta, indent=2, sort_keys=True)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "InterventionResult":
        """Read a sweep written by `save`, checked as `GeometryResult.load` checks a result.

        Every array is checked against the size its JSON announces before it is
        read, and every JSON value against its type; GeometryError naming the
        file if it is missing, damaged, altered or not a sweep.
        """
        meta, npz_file, npz_path, json_path = open_pair(path, "a sweep")
        if meta.get("kind") != KIND:
            raise GeometryError(f"load: {json_path} is not an intervention sweep (no \"kind\": \"{KIND}\"); "
                                "load geometry results with GeometryResult.load")
        check_checksum(meta, npz_file, npz_path, json_path)
        with malformed_as_error(npz_path, json_path, "the sweep"):
            arrays = read_npz(npz_file, array_limits(meta))
            if "n_grid" not in arrays:
                raise GeometryError(f"load: {npz_path} has no array 'n_grid'; save the sweep again")
            layers, heads = _labels(meta, "layers"), _labels(meta, "heads")
            intervened_heads = meta["intervened_heads"]
            return cls(
                n_grid=torch.from_numpy(arrays["n_grid"].copy()), layers=layers, heads=heads,
                stats=read_stats(meta, arrays, npz_path, layers, heads),
                scope=of_json_type(meta["scope"], str, "scope"),
                modes=tuple(of_json_type(m, str, "modes[...]") for m in of_json_type(meta["modes"], list, "modes")),
                ranking=of_json_type(meta["ranking"], str, "ranking"),
                n_controls=non_negative_int(meta["n_controls"], "n_controls"),
                intervened_layers=tuple(non_negative_int(i, "intervened_layers[...]")
                                        for i in of_json_type(meta["intervened_layers"], list, "intervened_layers")),
                intervened_heads=None if intervened_heads is None else tuple(
                    non_negative_int(i, "intervened_heads[...]")
                    for i in of_json_type(intervened_heads, list, "intervened_heads")
                ),
                n_documents=non_negative_int(meta["n_documents"], "n_documents"),
                n_tokens=non_negative_int(meta["n_tokens"], "n_tokens"),
                seed=non_negative_int(meta["seed"], "seed"),
                model_name=of_json_type(meta["model_name"], str, "model_name"),
                versions=read_versions(meta),
            )

    def equals(self, other: "InterventionResult") -> bool:
        """Same settings, grid, documents and statistics (bitwise, NaN equal to NaN)."""
        return isinstance(other, InterventionResult) and self._settings() == other._settings() and \
            self._same_statistics(other)
