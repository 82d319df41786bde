"""Hooks that reduce attention to declared diagnostics during one forward pass.

Per analysed layer two hooks are attached (names from `tl_geometry.capture.hook_names`):

- on ``hook_v`` (fires first): keep the value states of the keys the chosen
  queries can see, for the KV head behind each analysed query head
  (grouped-query attention: query head h reads KV head h // (n_heads / n_kv_heads));
- on ``hook_pattern``: build the layer's selection context (visible keys
  from causality, padding and the layer's sliding window; the sink; the
  top-N core, chunk by chunk) and run every active diagnostic on it; each
  field is reduced per sequence as it is declared, and both tensors are dropped.

So memory is bounded per layer, the full activation cache is never built, and
the analysis rides on the model's own forward pass (no second pass). What
the hooks analyse is the run's plan (`tl_geometry.capture.plan`); the
per-sequence reduction is `tl_geometry.capture.reduction`, and the pictures
(`tl_geometry.capture.pictures`) observe the selection diagnostic's rows. Every
kind of TransformerLens model checked (HookedTransformer 3.x,
TransformerBridge 3.x and 4.x, with or without compatibility mode) takes
``attention_mask=`` and derives positions from it.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from tl_geometry.capture.held_models import as_hookable
from tl_geometry.capture.hook_names import pattern_hook, value_hook
from tl_geometry.capture.pictures import PictureKeeper
from tl_geometry.capture.plan import RunPlan, plan_run
from tl_geometry.capture.query_sample import offsets_from_first, sample_queries
from tl_geometry.capture.reduction import SequenceReduction
from tl_geometry.capture.rows import RowsCapture, run_rows_pass
from tl_geometry.capture.tokens import (
    HookableModel,
    PreparedTokens,
    TokensLike,
    accepts_attention_mask,
    prepare_tokens,
)
from tl_geometry.config import GeometryConfig, make_config
from tl_geometry.diagnostics.registry import Diagnostic
from tl_geometry.engine.context import SelectionChunk, SelectionContext
from tl_geometry.errors import GeometryError
from tl_geometry.results.accumulators import Accumulator
from tl_geometry.results.bootstrap import document_weights
from tl_geometry.results.bootstrap import query_weights as query_weights_of
from tl_geometry.results.result import GeometryResult


# repr=False: TransformerLens names every hook after repr(hook.func), and a dataclass repr of this state
# formats its tensors, which cost about 25 ms per pass on SmolLM2 (1 % of a 1024-token pass).
@dataclass(repr=False)
class _LayerAnalysis:
    """State shared by the hooks of one pass; the layer is bound per hook with functools.partial."""

    prepared: PreparedTokens
    plan: RunPlan
    grid: Int[Tensor, " n"]
    heads: Int[Tensor, " head_index"]  # the plan's heads as a tensor
    values: dict[int, Tensor] = field(default_factory=dict)
    out: dict[int, dict[str, Tensor]] = field(default_factory=dict)
    queries: dict[int, dict[str, Tensor]] = field(default_factory=dict)
    pictures: PictureKeeper | None = None  # with config.picture_heads: observes the selection diagnostic
    # The taxonomy's own query rows (None: it reads the analysed queries; the plan names who reads them).
    sample: PreparedTokens | None = None
    # Per-row Poisson weights [batch, query, replicate] of the rows the resampled fields are measured on.
    query_weights: Tensor | None = None
    resampled: frozenset[str] = frozenset()
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
        settings = {d.name: self.plan.config.settings_for(d.name) for d in self.plan.diagnostics}
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
        for diagnostic in self.plan.diagnostics:
            out.update(diagnostic.declared(diagnostic.sequences(context, settings[diagnostic.name]), "sequences"))
        queries = reduction.query_rows() if self.plan.config.keep_queries else {}
        for i, layer in enumerate(layers):
            self.out[layer] = _unfolded(out, fold, i)
            self.replicates[layer] = _unfolded(replicates, fold, i)
            if self.plan.config.keep_queries:
                self.queries[layer] = _unfolded(queries, fold, i)

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
            self.grid,
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
        settings: dict[str, Any],
        query_weights: Tensor | None,
        observers: dict[Diagnostic, Callable[[SelectionChunk, dict[str, Tensor]], None]],
    ) -> SequenceReduction:
        """Run the diagnostics' per-row computations on every chunk of the context, reduced per sequence."""
        n_batch, n_heads, n_queries, _ = context.shape
        weights = None if query_weights is None else query_weights.to(context.pattern.device)
        reduction = SequenceReduction(n_batch, n_heads, n_queries, self.plan.config.keep_queries, weights, self.resampled)
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


def gathered(per_layer: Sequence[Tensor], dim: int) -> Tensor:
    """Per-layer reduced fields stacked along ``dim`` on the CPU, each moved once from wherever its layer ran."""
    if len({t.device for t in per_layer}) == 1:
        return torch.stack(list(per_layer), dim=dim).cpu()
    return torch.stack([t.cpu() for t in per_layer], dim=dim)


def _folded(t: Tensor, fold: int) -> Tensor:
    """``t`` (batch first) repeated for ``fold`` layers folded into the batch axis, layer by layer."""
    return t if fold == 1 else t.repeat(fold, *([1] * (t.ndim - 1)))


def _unfolded(fields: dict[str, Tensor], fold: int, i: int) -> dict[str, Tensor]:
    """The ``i``-th layer's slice of per-sequence fields whose batch axis folds ``fold`` layers."""
    return fields if fold == 1 else {name: t.unflatten(0, (fold, -1))[i] for name, t in fields.items()}


def new_accumulator(plan: RunPlan, grid: Int[Tensor, " n"]) -> Accumulator:
    """An empty accumulator for the fields of the plan's diagnostics."""
    config, specs = plan.config, plan.fields()
    return Accumulator(
        list(specs.values()),
        layers=plan.layers,
        heads=plan.heads,
        n_grid=grid,
        n_bootstrap=config.n_bootstrap,
        replicate_fields=config.resolve_bootstrap_fields(specs),
        keep_queries=config.keep_queries,
        picture_heads=config.picture_heads,
        document_rows=True,  # a run of few documents keeps their values: smaller than the sums (results/stats.py)
    )


def analyse_prepared(model: HookableModel, prepared: PreparedTokens, plan: RunPlan, accumulator: Accumulator) -> None:
    """One forward pass with the geometry hooks on prepared tokens; its documents are added to ``accumulator``."""
    config, layers, diagnostics, sampled = plan.config, plan.layers, plan.diagnostics, plan.sampled
    documents = prepared.documents()
    # A diagnostic whose settings ask for a query sample (the taxonomy) runs its rows on that sample.
    sample = None
    if sampled:
        own = config.settings_for(sampled[0].name)
        sample = sample_queries(prepared, own.n_queries, own.seed)
    resampled = frozenset(
        spec.name for d in diagnostics for spec in d.fields
        if spec.resample_queries and spec.name in accumulator.replicate_fields
    )  # fmt: skip
    query_weights = None
    if resampled:
        rows = offsets_from_first(sample if sample is not None else prepared)
        query_weights = query_weights_of([d.cpu() for d in documents], rows, config.n_bootstrap, config.seed)
    state = _LayerAnalysis(
        prepared=prepared,
        plan=plan,
        grid=accumulator.n_grid,
        heads=torch.tensor(plan.heads, dtype=torch.long),
        pictures=PictureKeeper(prepared, plan) if config.picture_heads else None,
        sample=sample,
        query_weights=query_weights,
        resampled=resampled,
    )
    fwd_hooks: list[tuple[str, Callable[..., None]]] = []
    for layer in layers:
        fwd_hooks.append((value_hook(layer), partial(state.value_hook, layer=layer)))
        fwd_hooks.append((pattern_hook(layer), partial(state.pattern_hook, layer=layer)))
    kwargs: dict[str, Any] = {"return_type": None}
    device = getattr(model.cfg, "device", None)
    if prepared.padded:
        if not accepts_attention_mask(model):
            raise GeometryError(
                "tokens: the sequences are padded but this model's forward takes no attention_mask; "
                "run the sequences one at a time (batch of 1) or with equal lengths"
            )
        kwargs["attention_mask"] = prepared.real.long() if device is None else prepared.real.long().to(device)
    tokens = prepared.tokens if device is None else prepared.tokens.to(device)
    if plan.config.capture == "rows":
        capture = RowsCapture(capture_positions(prepared, sample), state.rows_hook, layers)
        run_rows_pass(model, tokens, kwargs.get("attention_mask"), capture)
        state.analyse_kept()
    else:
        with torch.inference_mode(), model.hooks(fwd_hooks=fwd_hooks):
            model(tokens, **kwargs)
    silent = [layer for layer in layers if layer not in state.out]
    if silent:
        raise GeometryError(
            f"hooks {[pattern_hook(layer) for layer in silent]} never fired; the model's forward pass skipped "
            "these layers' attention (check stop_at_layer or the model's attention implementation)"
        )
    # Results live on the CPU: one transfer of the reduced fields per batch (per device of a split model).
    values = {name: gathered([state.out[layer][name] for layer in layers], dim=1) for name in state.out[layers[0]]}
    queries = None
    if config.keep_queries:
        queries = {
            name: gathered([state.queries[layer][name] for layer in layers], dim=1)
            for name in state.queries[layers[0]]
        }
    weights = document_weights([d.cpu() for d in documents], config.n_bootstrap, config.seed)
    within = {
        name: gathered([state.replicates[layer][name] for layer in layers], dim=2) for name in resampled
    }  # [doc, replicate, layer, head_index, *trailing]
    accumulator.add(
        values,
        weights,
        n_tokens=sum(len(d) for d in documents),
        queries=queries,
        query_positions=offsets_from_first(prepared) if queries is not None else None,
        pictures=[] if state.pictures is None else state.pictures.kept,
        resampled=within,
    )


def capture_positions(prepared: PreparedTokens, sample: PreparedTokens | None) -> Int[Tensor, "batch query"]:
    """The query rows the rows path builds: the analysed queries, then the query sample's."""
    return prepared.query_index if sample is None else torch.cat([prepared.query_index, sample.query_index], dim=1)


def most_visible_keys(prepared: Sequence[PreparedTokens], plan: RunPlan) -> int:
    """The most keys any analysed query of these batches sees in an analysed layer (0 without batches)."""
    used = [plan.windows[layer] for layer in plan.layers]
    return max((batch.max_visible(used) for batch in prepared), default=0)


def grid_for(prepared: Sequence[PreparedTokens], plan: RunPlan) -> Int[Tensor, " n"]:
    """The N grid of a run: the config's, with the default's last N the most keys any analysed query sees."""
    return plan.config.resolve_n_grid(most_visible_keys(prepared, plan))


def run_with_geometry_hooks(
    model: HookableModel | Any,
    tokens: TokensLike,
    *,
    config: GeometryConfig | None = None,
    attention_mask: Int[Tensor, "batch pos"] | Bool[Tensor, "batch pos"] | None = None,
    tokenizer: Any = None,
    **overrides: Any,
) -> GeometryResult:
    """Selection metrics (and the config's diagnostics) of every analysed layer and head, from one forward pass.

    Args:
        model: a TransformerLens model (HookedTransformer, TransformerBridge
            with or without compatibility mode), a ``transformers`` causal LM
            or an nnsight ``LanguageModel`` around a local model (wrapped
            once into a bridge, see `tl_geometry.capture.held_models`); left
            exactly as it was.
        tokens: token ids ``[batch, pos]`` (used as given), a string, or a
            list of strings (tokenised one by one with BOS prepended unless
            ``prepend_bos=False``, then right-padded). Each sequence is one document.
        config: the GeometryConfig (default ``GeometryConfig()``).
        attention_mask: for padded token tensors, 1 for real tokens (left or
            right padding); without it every token counts as real.
        tokenizer: for a ``transformers`` or nnsight model, its tokenizer
            (default: the nnsight model's, else the one saved with the model).
        **overrides: config fields to replace, e.g. ``layers=[0]``.

    Returns:
        GeometryResult: every field's statistics over the sequences
        (``result.precision`` is the ``[layer, head_index, n]`` mean).

    Raises:
        GeometryError: bad tokens, config or layer/head indices, missing hooks;
            a held model TransformerLens cannot wrap, or without a tokenizer for text.

    Example:
        >>> result = run_with_geometry_hooks(model, "the cat sat", n_grid=[1, 2])  # doctest: +SKIP
        >>> result.precision.shape  # [layer, head_index, n]  # doctest: +SKIP
    """
    config = make_config(config, overrides)
    model = as_hookable(model, tokenizer)
    prepared = prepare_tokens(model, tokens, config, attention_mask)
    plan = plan_run(model, config)
    accumulator = new_accumulator(plan, grid_for([prepared], plan))
    analyse_prepared(model, prepared, plan, accumulator)
    return GeometryResult.from_accumulator(accumulator, config=plan.config, model_name=model_name(model))


def model_name(model: HookableModel) -> str:
    """``model.cfg.model_name``, or the class name."""
    return str(getattr(model.cfg, "model_name", type(model).__name__))
