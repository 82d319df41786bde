"""The analysis of one layer's attention rows during a forward pass, shared by both capture paths.

The pattern path's hooks (``hook_v``, then ``hook_pattern``; attached by
`tl_geometry.capture.hooks`) and the rows path's callback
(`tl_geometry.capture.rows`) hand each analysed layer's attention rows and
value states to a `LayerAnalysis`: it builds the layer's selection context
(visible keys from causality, padding and the layer's sliding window; the
sink; the top-N core over the plan's N grid, chunk by chunk), runs every
active diagnostic on it with the settings the plan resolved, and reduces each
field per sequence as it is declared (`tl_geometry.capture.reduction`).
Everything it reads of the run is the plan (`tl_geometry.capture.plan`).
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tl_geometry.capture.hook_names import pattern_hook, value_hook
from tl_geometry.capture.picture_keeper import PictureKeeper
from tl_geometry.capture.plan import RunPlan
from tl_geometry.capture.reduction import SequenceReduction
from tl_geometry.capture.tokens import PreparedTokens
from tl_geometry.diagnostics.registry import Diagnostic
from tl_geometry.engine.context import SelectionChunk, SelectionContext
from tl_geometry.errors import GeometryError


# repr=False: TransformerLens names every hook after repr(hook.func), and a dataclass repr of this state
# formats its tensors, which cost about 25 ms per pass on SmolLM2 (1 % of a 1024-token pass).
@dataclass(repr=False)
class LayerAnalysis:
    """State shared by the hooks of one pass; the layer is bound per hook with functools.partial."""

    prepared: PreparedTokens
    plan: RunPlan  # with its grid
    heads: Int[Tensor, " head_index"]  # the plan's heads as a tensor
    values: dict[int, Tensor] = field(default_factory=dict)
    out: dict[int, dict[str, Tensor]] = field(default_factory=dict)
    queries: dict[int, dict[str, Tensor]] = field(default_factory=dict)
    pictures: PictureKeeper | None = None  # with config.picture_heads: observes the selection diagnostic
    # The roles diagnostic's own query rows (None: it reads the analysed queries; the plan names who reads them).
    sample: PreparedTokens | None = None
    # Per-row Poisson weights [batch, query, replicate] of the rows the resampled fields are measured on.
    query_weights: Tensor | None = None
    replicates: dict[int, dict[str, Tensor]] = field(default_factory=dict)
    # The rows path's layers not analysed yet: their attention rows and value states (see `rows_hook`).
    kept_rows: dict[int, tuple[Tensor, Tensor]] = field(default_factory=dict)

    def _check_values(self, v: Tensor, layer: int) -> None:
        if v.ndim != 4 or v.shape[2] != self.plan.n_kv:
            raise GeometryError(
                f"{value_hook(layer)}: expected [batch, pos, n_key_value_heads={self.plan.n_kv}, d_head], "
                f"got {list(v.shape)}"
            )

    def value_hook(self, v: Float[Tensor, "batch pos kv_head d_head"], *, hook: Any, layer: int) -> None:
        """Keep the value states of the keys the queries can see (a view: read, never written, until the pattern)."""
        self._check_values(v, layer)
        self.values[layer] = v[:, : self.prepared.n_keys]

    def pattern_hook(self, pattern: Float[Tensor, "batch head_index query_pos key_pos"], *, hook: Any, layer: int) -> None:
        """Build the layer's selection context and run every active diagnostic on it."""
        if layer not in self.values:
            raise GeometryError(
                f"{pattern_hook(layer)} fired before {value_hook(layer)}; this model computes attention in an "
                "order tl_geometry does not support"
            )
        p = self.prepared
        if pattern.ndim != 4 or pattern.shape[1] != self.plan.n_heads or pattern.shape[2] < p.n_keys:
            raise GeometryError(
                f"{pattern_hook(layer)}: expected [batch, n_heads={self.plan.n_heads}, query_pos, key_pos] with "
                f"pos >= {p.n_keys}, got {list(pattern.shape)}"
            )
        sample_index = None if self.sample is None else self.sample.query_index
        self.analyse_layers((layer,), pattern, self.values.pop(layer), p.query_index, sample_index,
                            pattern_hook(layer))

    def rows_hook(self, layer: int, rows: Float[Tensor, "batch pattern_head query key_pos"],
                  v: Float[Tensor, "batch key_pos kv_head d_head"]) -> None:
        """The rows path's callback (`tl_geometry.capture.rows`): the analysed query rows only, and the values.

        The rows are those of `capture_positions`: the analysed queries, then the query sample's (if any).
        They are kept, and analysed together with other layers' of their device (`analyse_kept`) once the
        rows and values kept on that device reach the memory budget, and after the pass: a few large chunks
        cost less than many small ones. The budget holds per device: a model split by a device map keeps
        each block's rows where the block ran.
        """
        self._check_values(v, layer)
        self.kept_rows[layer] = (rows, v[:, : self.prepared.n_keys])
        if kept_bytes(self.kept_rows, rows.device) >= self.plan.config.memory_budget_mib * 2**20:
            self.analyse_kept(rows.device)

    def analyse_kept(self, device: torch.device | None = None) -> None:
        """Analyse the kept layers of the rows path (those on ``device``; None: all), those of one sliding window
        and device folded into one batch axis (`kept_groups`), each where its rows live.

        A layer with a pictured head is analysed on its own (its pictures observe its own context).
        """
        pictured = {layer for layer, _ in self.plan.config.picture_heads} if self.pictures is not None else set()
        n_queries = self.prepared.query_index.shape[1]
        for layers in kept_groups(self.kept_rows, self.plan.windows, pictured, device):
            kept = [self.kept_rows.pop(layer) for layer in layers]
            rows = torch.cat([r for r, _ in kept])
            values = torch.cat([v for _, v in kept])
            del kept
            at = torch.arange(rows.shape[2], device=rows.device).expand(rows.shape[0], -1)
            sample_index = None if self.sample is None else at[:, n_queries:]
            self.analyse_layers(tuple(layers), rows, values, at[:, :n_queries], sample_index,
                                f"the attention rows of layers {layers}")

    def analyse_layers(self, layers: tuple[int, ...], pattern: Float[Tensor, "fold_batch pattern_head query_pos key_pos"],
                       values: Float[Tensor, "fold_batch key kv_head d_head"],
                       query_index: Int[Tensor, "fold_batch query"],
                       sample_index: Int[Tensor, "fold_batch sample"] | None, label: str) -> None:
        """Run every active diagnostic on the attention rows of ``layers`` (at ``query_index`` of the pattern's
        query axis; the query sample's rows at ``sample_index``).

        Several layers of one sliding window come folded into the batch axis, layer by layer (``[layer *
        batch, ...]``): every diagnostic works per sequence, so each layer's results are its slice.
        """
        p = self.prepared
        fold = len(layers)
        device = pattern.device
        window = self.plan.windows[layers[0]]
        if p.padded:  # padding keys get zero vectors (a copy: the values may be the model's own tensor)
            values = values.masked_fill(~_folded(p.real[:, : p.n_keys], fold)[:, :, None, None].to(device), 0.0)
        settings = self.plan.settings
        on_sample = self.sample is not None
        main = tuple(d for d in self.plan.diagnostics if not (on_sample and d in self.plan.sampled))
        weights = None if self.query_weights is None else _folded(self.query_weights, fold)
        context = self._context(pattern, values, p, window, query_index, fold, label)
        observers = {} if self.pictures is None or fold > 1 else self.pictures.observers(layers[0], context, self.heads)
        reduction = self._reduce(context, main, settings, None if on_sample else weights, observers)
        out = reduction.means()
        replicates = reduction.replicate_means()
        if on_sample:
            sample = self._context(pattern, values[:, : self.sample.n_keys], self.sample, window,
                                   sample_index, fold, label)  # type: ignore[arg-type]
            sampled = self._reduce(sample, self.plan.sampled, settings, weights, {})
            out.update(sampled.means())
            replicates.update(sampled.replicate_means())
        queries = reduction.query_rows() if self.plan.config.keep_queries else {}
        for i, layer in enumerate(layers):
            self.out[layer] = dict(_unfolded(out, fold, i))
            self.replicates[layer] = _unfolded(replicates, fold, i)
            if self.plan.config.keep_queries:
                self.queries[layer] = _unfolded(queries, fold, i)
            # The per-sequence diagnostics layer by layer, as on the pattern path: their slices of sequences
            # then hold one layer's rows at most, so that folding layers (which speeds up the row chunks) does
            # not raise their working memory above the pattern path's (the profile fit of 30 folded layers
            # filled the budget where one layer's took a tenth of it).
            one = context if fold == 1 else self._context(
                _layer(pattern, fold, i), _layer(values, fold, i), p, window, _layer(query_index, fold, i), 1, label)
            for diagnostic in self.plan.diagnostics:
                self.out[layer].update(
                    diagnostic.declared(diagnostic.sequences(one, settings[diagnostic.name]), "sequences"))

    def _context(
        self, pattern: Tensor, values: Tensor, prepared: PreparedTokens, window: int | None, query_index: Tensor,
        fold: int, label: str,
    ) -> SelectionContext:
        """The selection context of ``prepared``'s query rows (``fold`` layers of them, folded into the batch
        axis), at ``query_index`` of the pattern's query axis."""
        device = pattern.device
        visible = prepared.visible(window)
        return SelectionContext(
            pattern,
            values,
            _folded(visible, fold).to(device),
            _folded(prepared.sink(visible), fold).to(device),
            _folded(prepared.query_valid, fold).to(device),
            self.plan.grid,  # type: ignore[arg-type]
            ranking=self.plan.config.ranking,  # type: ignore[arg-type]
            distance=self.plan.config.distance,  # type: ignore[arg-type]
            memory_budget_mib=self.plan.config.memory_budget_mib,
            costs=[d.cost for d in self.plan.diagnostics],
            query_index=query_index.to(device),
            real=_folded(prepared.real[:, : prepared.n_keys], fold).to(device),
            kv_heads=self.plan.kv_heads.to(device),
            value_heads=self.plan.kv_heads.to(device),
            heads=self.heads.to(device),
            label=label,
        )

    def _reduce(
        self,
        context: SelectionContext,
        diagnostics: Sequence[Diagnostic],
        settings: Mapping[str, Any],
        query_weights: Tensor | None,
        observers: dict[Diagnostic, Callable[[SelectionChunk, dict[str, Tensor]], None]],
    ) -> SequenceReduction:
        """Run the diagnostics' per-row computations on every chunk of the context, reduced per sequence."""
        n_batch, n_heads, n_queries, _ = context.shape
        weights = None if query_weights is None else query_weights.to(context.pattern.device)
        reduction = SequenceReduction(n_batch, n_heads, n_queries, self.plan.config.keep_queries, weights, self.plan.resampled)
        for chunk in context.chunks():
            for diagnostic in diagnostics:
                rows = diagnostic.declared(diagnostic.rows(chunk, settings[diagnostic.name]), "rows")
                reduction.add_all(rows, chunk.batch, chunk.head, chunk.query)
                if (observe := observers.get(diagnostic)) is not None:
                    observe(chunk, rows)
        return reduction


def kept_bytes(kept: dict[int, tuple[Tensor, Tensor]], device: torch.device) -> int:
    """The bytes of the rows and values the rows path keeps on ``device`` (what its memory budget bounds)."""
    return sum(r.numel() * r.element_size() + v.numel() * v.element_size()
               for r, v in kept.values() if r.device == device)


def kept_groups(kept: dict[int, tuple[Tensor, Tensor]], windows: Sequence[int | None],
                pictured: set[int], device: torch.device | None = None) -> list[list[int]]:
    """The kept layers of the rows path (those on ``device``; None: all) in groups analysed as one batch: the
    same sliding window and the same device (a model split by a device map keeps each block's rows where the
    block runs, and they are reduced there), a pictured layer alone."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for layer, (rows, _) in kept.items():
        if device is not None and rows.device != device:
            continue
        key = (windows[layer], str(rows.device), layer if layer in pictured else None)
        groups.setdefault(key, []).append(layer)
    return list(groups.values())


def _folded(t: Tensor, fold: int) -> Tensor:
    """``t`` (batch first) repeated for ``fold`` layers folded into the batch axis, layer by layer."""
    return t if fold == 1 else t.repeat(fold, *([1] * (t.ndim - 1)))


def _layer(t: Tensor, fold: int, i: int) -> Tensor:
    """The ``i``-th layer's slice (a view) of ``t``, whose batch axis folds ``fold`` layers, layer by layer."""
    return t.unflatten(0, (fold, -1))[i]


def _unfolded(fields: dict[str, Tensor], fold: int, i: int) -> dict[str, Tensor]:
    """The ``i``-th layer's slice of per-sequence fields whose batch axis folds ``fold`` layers."""
    return fields if fold == 1 else {name: _layer(t, fold, i) for name, t in fields.items()}
