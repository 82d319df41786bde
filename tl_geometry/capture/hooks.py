"""Hooks that reduce attention to declared diagnostics during one forward pass.

`run_with_geometry_hooks` makes the run's plan once (`tl_geometry.capture.plan`:
layers, heads, diagnostics and their settings, the capture path, the N grid),
then one pass: on the rows path (`tl_geometry.capture.rows`) the model's fast
attention runs and only the analysed rows are built; on the pattern path, per
analysed layer two hooks are attached (names from `tl_geometry.capture.hook_names`):

- on ``hook_v`` (fires first): keep the value states of the keys the chosen
  queries can see, for the KV head behind each analysed query head
  (grouped-query attention: query head h reads KV head h // (n_heads / n_kv_heads));
- on ``hook_pattern``: hand the layer's rows to its analysis
  (`tl_geometry.capture.layer_analysis`: the selection context, every active
  diagnostic, each field reduced per sequence as it is declared); both
  tensors are dropped.

So memory is bounded per layer, the full activation cache is never built, and
the analysis rides on the model's own forward pass (no second pass). The
pictures (`tl_geometry.capture.pictures`) observe the selection diagnostic's rows. Every
kind of TransformerLens model checked (HookedTransformer 3.x,
TransformerBridge 3.x and 4.x, with or without compatibility mode) takes
``attention_mask=`` and derives positions from it.
"""

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from tl_geometry.capture.held_models import as_hookable
from tl_geometry.capture.hook_names import pattern_hook, value_hook
from tl_geometry.capture.layer_analysis import LayerAnalysis
from tl_geometry.capture.pictures import PictureKeeper
from tl_geometry.capture.plan import RunPlan, plan_run
from tl_geometry.capture.query_sample import offsets_from_first, sample_queries
from tl_geometry.capture.rows import RowsCapture, run_rows_pass
from tl_geometry.capture.tokens import (
    HookableModel,
    PreparedTokens,
    TokensLike,
    accepts_attention_mask,
    prepare_tokens,
)
from tl_geometry.config import GeometryConfig, make_config
from tl_geometry.errors import GeometryError
from tl_geometry.results.accumulators import Accumulator
from tl_geometry.results.bootstrap import document_weights
from tl_geometry.results.bootstrap import query_weights as query_weights_of
from tl_geometry.results.result import GeometryResult


def gathered(per_layer: Sequence[Tensor], dim: int) -> Tensor:
    """Per-layer reduced fields stacked along ``dim`` on the CPU, each moved once from wherever its layer ran."""
    if len({t.device for t in per_layer}) == 1:
        return torch.stack(list(per_layer), dim=dim).cpu()
    return torch.stack([t.cpu() for t in per_layer], dim=dim)


def analyse_prepared(model: HookableModel, prepared: PreparedTokens, plan: RunPlan, accumulator: Accumulator) -> None:
    """One forward pass with the geometry hooks on prepared tokens; its documents are added to ``accumulator``."""
    config, layers, sampled, resampled = plan.config, plan.layers, plan.sampled, plan.resampled
    documents = prepared.documents()
    # A diagnostic whose settings ask for a query sample (the taxonomy) runs its rows on that sample.
    sample = None
    if sampled:
        own = plan.settings[sampled[0].name]
        sample = sample_queries(prepared, own.n_queries, own.seed)
    query_weights = None
    if resampled:
        rows = offsets_from_first(sample if sample is not None else prepared)
        query_weights = query_weights_of([d.cpu() for d in documents], rows, config.n_bootstrap, config.seed)
    state = LayerAnalysis(
        prepared=prepared,
        plan=plan,
        heads=torch.tensor(plan.heads, dtype=torch.long),
        pictures=PictureKeeper(prepared, plan) if config.picture_heads else None,
        sample=sample,
        query_weights=query_weights,
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
    if plan.capture == "rows":
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
    plan = plan_run(model, config, [prepared])  # the layers, diagnostics, capture path and N grid, decided once
    accumulator = plan.new_accumulator()
    analyse_prepared(model, prepared, plan, accumulator)
    return GeometryResult.from_accumulator(accumulator, config=plan.config, model_name=model_name(model),
                                           provenance=plan.provenance())


def model_name(model: HookableModel) -> str:
    """``model.cfg.model_name``, or the class name."""
    return str(getattr(model.cfg, "model_name", type(model).__name__))
