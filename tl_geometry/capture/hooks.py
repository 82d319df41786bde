"""Hooks that reduce attention to selection metrics during one forward pass.

Per analysed layer two hooks are attached (names from `tl_geometry.capture.hook_names`):

- on ``hook_v`` (fires first): keep the value states of the keys the chosen
  queries can see, for the KV head behind each analysed query head
  (grouped-query attention: query head h reads KV head h // (n_heads / n_kv_heads));
- on ``hook_pattern``: take the attention rows of the chosen queries, call
  `tl_geometry.engine.metrics.selection_metrics` once for all heads and
  queries of the layer, average over queries, and drop both tensors.

So memory is bounded per layer, the full activation cache is never built, and
the analysis rides on the model's own forward pass (no second pass).

Padding: sequences of different lengths are right-padded and the model gets
an ``attention_mask``; padded keys are never visible, and each sequence's
"last" query is its last real token. Token tensors may also be left-padded if
their ``attention_mask`` is passed. Every kind of TransformerLens model checked
(HookedTransformer 3.x, TransformerBridge 3.x and 4.x, with or without
compatibility mode) takes ``attention_mask=`` and derives positions from it.
"""

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, runtime_checkable

import einops
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from tl_geometry.activations import LayerActivations
from tl_geometry.config import GeometryConfig, make_config
from tl_geometry.errors import GeometryError
from tl_geometry.capture.hook_names import pattern_hook, value_hook
from tl_geometry.engine.metrics import selection_metrics
from tl_geometry.results.result import GeometryResult, result_from_parts

TokensLike = Tensor | str | Sequence[str]


@runtime_checkable
class HookableModel(Protocol):
    """What this package needs of a TransformerLens model (structural, so any version works).

    ``HookedTransformer`` (transformer-lens <= 3.x) and ``TransformerBridge``
    (3.x, 4.x; with or without compatibility mode) match it.
    """

    @property
    def cfg(self) -> Any:
        """The model's config: ``n_layers``, ``n_heads``, ``n_key_value_heads`` (GQA), ``device``."""
        ...

    @property
    def hook_dict(self) -> Any:
        """Hook points by name; ``blocks.{l}.attn.hook_v`` and ``hook_pattern`` must be among them."""
        ...

    def hooks(self, *args: Any, **kwargs: Any) -> Any:
        """Context manager that attaches forward hooks and removes them on exit, also after an error."""
        ...

    def to_tokens(self, *args: Any, **kwargs: Any) -> Any:
        """Token ids of a text (BOS prepended when asked), ``[batch, pos]``."""
        ...

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class PreparedTokens:
    """Token ids, which of them are real (not padding), and the queries to analyse."""

    tokens: Int[Tensor, "batch pos"]
    real: Bool[Tensor, "batch pos"]
    query_index: Int[Tensor, "batch query"]  # position of each analysed query in the padded row
    query_valid: Bool[Tensor, "batch query"]  # False where a sequence is too short ("all" queries)

    @property
    def padded(self) -> bool:
        return not bool(self.real.all())

    @property
    def n_keys(self) -> int:
        """Keys on the key axis: up to the last analysed query."""
        return int(self.query_index.max()) + 1

    def key_mask(self) -> Bool[Tensor, "batch query key"]:
        """Keys visible to each query: causal (k <= q) and not padding."""
        keys = torch.arange(self.n_keys, device=self.real.device)
        causal = keys <= self.query_index.unsqueeze(-1)
        return causal & self.real[:, None, : self.n_keys]

    def max_visible(self) -> int:
        """Most keys any analysed query sees (the default grid's last N)."""
        return int((self.key_mask() & self.query_valid.unsqueeze(-1)).sum(-1).max())


def _tokenize(model: HookableModel, texts: Sequence[str], prepend_bos: bool) -> tuple[Tensor, Tensor]:
    """Tokenise each text alone and right-pad: ``(tokens, real)``."""
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise GeometryError(
            "tokens: got text but the model has no tokenizer; pass token ids as a [batch, pos] integer "
            "tensor, or attach a tokenizer to the model"
        )
    if len(texts) == 0:
        raise GeometryError("tokens: got an empty list of texts; pass at least one string")
    rows = [model.to_tokens(text, prepend_bos=prepend_bos)[0].cpu() for text in texts]
    if any(len(row) == 0 for row in rows):
        raise GeometryError("tokens: a text tokenised to no tokens; drop empty strings or use prepend_bos=True")
    width = max(len(row) for row in rows)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    tokens = torch.full((len(rows), width), pad_id, dtype=torch.long)
    real = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = row
        real[i, : len(row)] = True
    return tokens, real


def _check_token_tensor(tokens: Tensor, attention_mask: Tensor | None) -> Tensor:
    """Validate a token tensor and return its ``real`` mask."""
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise GeometryError(
            f"tokens: expected integer token ids, got dtype {tokens.dtype}; "
            "pass model.to_tokens(text) or a LongTensor (embeddings are not supported)"
        )
    if tokens.ndim != 2 or tokens.shape[1] == 0 or tokens.shape[0] == 0:
        raise GeometryError(
            f"tokens: expected shape [batch, pos] with batch, pos >= 1, got {list(tokens.shape)}; "
            "for one sequence use tokens.unsqueeze(0)"
        )
    if attention_mask is None:
        return torch.ones(tokens.shape, dtype=torch.bool, device=tokens.device)
    if attention_mask.shape != tokens.shape:
        raise GeometryError(
            f"attention_mask: expected the shape of tokens {list(tokens.shape)}, got {list(attention_mask.shape)}"
        )
    real = attention_mask.bool()
    counts = real.sum(-1)
    if (counts == 0).any():
        raise GeometryError("attention_mask: a row has no real token; drop empty sequences")
    first = real.int().argmax(-1)
    span = torch.arange(tokens.shape[1], device=real.device)
    contiguous = (span >= first[:, None]) & (span < (first + counts)[:, None])
    if not torch.equal(contiguous, real):
        raise GeometryError(
            "attention_mask: the real tokens of a row must be one contiguous run (left or right padding), "
            "found gaps"
        )
    return real


def prepare_tokens(
    model: HookableModel, tokens: TokensLike, config: GeometryConfig, attention_mask: Tensor | None = None
) -> PreparedTokens:
    """Tokenise if needed, find the real tokens and the query positions of every sequence."""
    if isinstance(tokens, str):
        tokens = [tokens]
    if isinstance(tokens, Tensor):
        real = _check_token_tensor(tokens, attention_mask)
    elif isinstance(tokens, Sequence) and all(isinstance(t, str) for t in tokens):
        if attention_mask is not None:
            raise GeometryError("attention_mask: only for token tensors; text is padded here")
        tokens, real = _tokenize(model, tokens, config.prepend_bos)
    else:
        raise GeometryError(
            f"tokens: expected a [batch, pos] integer tensor, a string or a list of strings, "
            f"got {type(tokens).__name__}"
        )
    device = real.device
    lengths = real.sum(-1)
    first = real.int().argmax(-1)
    if config.query_positions == "last":
        offsets = torch.zeros((len(lengths), 1), dtype=torch.long, device=device)
        offsets += (lengths - 1).unsqueeze(-1)
    elif config.query_positions == "all":
        offsets = torch.arange(int(lengths.max()), device=device).expand(len(lengths), -1)
    else:
        positions = torch.tensor(config.query_positions, dtype=torch.long, device=device)
        shortest = int(lengths.min())
        if int(positions.max()) >= shortest:
            raise GeometryError(
                f"query_positions: position {int(positions.max())} is beyond the shortest sequence "
                f"({shortest} tokens); use positions < {shortest} or query_positions='last'"
            )
        offsets = positions.expand(len(lengths), -1)
    valid = offsets < lengths.unsqueeze(-1)
    # Rows too short for a query point it at their last real token; they are masked out later.
    offsets = torch.minimum(offsets, (lengths - 1).unsqueeze(-1))
    return PreparedTokens(tokens=tokens, real=real, query_index=first.unsqueeze(-1) + offsets, query_valid=valid)


def kv_head_of(heads: Int[Tensor, " head_index"], n_heads: int, n_kv_heads: int) -> Int[Tensor, " head_index"]:
    """The KV head each query head reads under grouped-query attention: h // (n_heads / n_kv_heads).

    >>> kv_head_of(torch.arange(4), 4, 2).tolist()
    [0, 0, 1, 1]
    """
    return heads // (n_heads // n_kv_heads)


def _resolve_indices(name: str, chosen: tuple[int, ...] | None, size: int, cfg_field: str) -> tuple[int, ...]:
    if chosen is None:
        return tuple(range(size))
    bad = [i for i in chosen if i >= size]
    if bad:
        raise GeometryError(
            f"{name}: {bad} out of range; the model has {size} {name} (cfg.{cfg_field}), use indices 0..{size - 1}"
        )
    return chosen


def _model_shape(model: HookableModel, config: GeometryConfig) -> tuple[tuple[int, ...], tuple[int, ...], int, int]:
    """Layers and heads to analyse, and the model's query and KV head counts."""
    cfg = model.cfg
    n_heads = int(cfg.n_heads)
    n_kv = int(getattr(cfg, "n_key_value_heads", None) or n_heads)
    if n_heads % n_kv:
        raise GeometryError(f"model: n_heads = {n_heads} is not a multiple of n_key_value_heads = {n_kv}")
    layers = _resolve_indices("layers", config.layers, int(cfg.n_layers), "n_layers")
    heads = _resolve_indices("heads", config.heads, n_heads, "n_heads")
    hook_dict = model.hook_dict
    for layer in layers:
        for name in (value_hook(layer), pattern_hook(layer)):
            if name not in hook_dict:
                raise GeometryError(
                    f"model: no hook point {name!r}; tl_geometry reads the value states and attention "
                    "pattern of each layer. On a TransformerBridge call model.enable_compatibility_mode() "
                    "or boot it with eager attention; for other models, analyse only layers that expose "
                    "these hooks (see model.hook_dict)"
                )
    return layers, heads, n_heads, n_kv


def _accepts_attention_mask(model: HookableModel) -> bool:
    params = inspect.signature(model.forward).parameters.values()
    return any(p.name == "attention_mask" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


@dataclass
class _LayerAnalysis:
    """State shared by the two hooks of one run; the layer is bound per hook with functools.partial."""

    prepared: PreparedTokens
    config: GeometryConfig
    grid: Int[Tensor, " n"]
    heads: Int[Tensor, " head_index"]
    kv_heads: Int[Tensor, " head_index"]  # KV head read by each analysed query head
    n_heads: int
    n_kv: int
    values: dict[int, Tensor]
    out: dict[int, dict[str, Tensor]]
    diagnostics: tuple[Callable[[LayerActivations], dict[str, Tensor]], ...] = ()

    def value_hook(self, v: Float[Tensor, "batch pos kv_head d_head"], *, hook: Any, layer: int) -> None:
        """Keep the analysed heads' value states (GQA-aligned) of the keys the queries can see."""
        if v.ndim != 4 or v.shape[2] != self.n_kv:
            raise GeometryError(
                f"{value_hook(layer)}: expected [batch, pos, n_key_value_heads={self.n_kv}, d_head], "
                f"got {list(v.shape)}"
            )
        self.values[layer] = v[:, : self.prepared.n_keys, self.kv_heads.to(v.device)]

    def pattern_hook(self, pattern: Float[Tensor, "batch head_index query_pos key_pos"], *, hook: Any, layer: int) -> None:
        """Selection metrics of the chosen query rows, averaged over queries, for all heads at once."""
        if layer not in self.values:
            raise GeometryError(
                f"{pattern_hook(layer)} fired before {value_hook(layer)}; this model computes attention in an "
                "order tl_geometry does not support"
            )
        p = self.prepared
        real_keys = p.real[:, : p.n_keys, None, None].to(self.values[layer].device)
        values = self.values.pop(layer).masked_fill(~real_keys, 0.0)
        if pattern.ndim != 4 or pattern.shape[1] != self.n_heads or pattern.shape[2] < p.n_keys:
            raise GeometryError(
                f"{pattern_hook(layer)}: expected [batch, n_heads={self.n_heads}, query_pos, key_pos] with "
                f"pos >= {p.n_keys}, got {list(pattern.shape)}"
            )
        device = pattern.device
        batch = torch.arange(pattern.shape[0], device=device)[:, None, None]
        query_index = p.query_index.to(device)
        key_mask = p.key_mask().to(device)
        per_query: dict[str, list[Tensor]] = {}
        for queries in _query_chunks(values, query_index.shape[1], self.config.memory_budget_mib):
            q = query_index[:, queries]
            alpha = pattern[batch, self.heads.to(device)[None, :, None], q[:, None, :], : p.n_keys]
            mask = einops.repeat(key_mask[:, queries], "batch query key -> batch head query key", head=len(self.heads))
            if not torch.isfinite(alpha[mask]).all():
                raise GeometryError(
                    f"{pattern_hook(layer)}: the model returned NaN or Inf attention weights on real query rows "
                    "over visible keys. A raw TransformerBridge over Llama in float64 does this with left "
                    "padding (fully masked pad rows turn NaN and spread); pass text or right-padded tokens, "
                    "run in float32, or call model.enable_compatibility_mode()"
                )
            # Hidden keys are ignored by the engine; zero them so that whatever the model left at
            # padded positions (possibly NaN) cannot reach its input checks.
            alpha = alpha.masked_fill(~mask, 0.0)
            v = einops.repeat(values, "batch key head d_head -> batch head query key d_head", query=q.shape[1])
            metrics = selection_metrics(
                alpha,
                v,
                self.grid,
                key_mask=mask,
                ranking=self.config.ranking,
                distance=self.config.distance,
                memory_budget_mib=self.config.memory_budget_mib,
            )
            for name, t in metrics.per_row_fields().items():
                per_query.setdefault(name, []).append(t)
        invalid = ~p.query_valid.to(device)[:, None, :, None]  # [batch, 1, query, 1]
        self.out[layer] = {
            name: torch.nanmean(torch.cat(chunks, dim=2).masked_fill(invalid, math.nan), dim=2).cpu()
            for name, chunks in per_query.items()
        }
        if self.diagnostics:
            heads = self.heads.to(device)[None, :, None]
            mask = einops.repeat(key_mask, "batch query key -> batch head query key", head=len(self.heads))
            seen = LayerActivations(
                layer=layer,
                values=values,
                alpha=pattern[batch, heads, query_index[:, None, :], : p.n_keys].masked_fill(~mask, 0.0),
                key_mask=mask,
                query_index=query_index,
                query_valid=p.query_valid.to(device),
                real=p.real[:, : p.n_keys].to(device),
                grid=self.grid,
                kv_heads=self.kv_heads.to(device),
            )
            for diagnostic in self.diagnostics:
                self.out[layer].update({name: t.cpu() for name, t in diagnostic(seen).items()})


def diagnostic_functions(names: Sequence[str]) -> tuple[Callable[[LayerActivations], dict[str, Tensor]], ...]:
    """The per-layer functions behind the config's diagnostics (imported only when asked for)."""
    functions = []
    for name in names:
        if name == "assumptions":
            from tl_geometry.diagnostics.assumptions import assumption_diagnostics

            functions.append(assumption_diagnostics)
        elif name == "bounds":
            from tl_geometry.theory.bounds import bound_diagnostics

            functions.append(bound_diagnostics)
        elif name == "taxonomy":
            from tl_geometry.diagnostics.taxonomy import taxonomy_features

            functions.append(taxonomy_features)
    return tuple(functions)


def _query_chunks(values: Tensor, n_queries: int, budget_mib: float) -> list[slice]:
    """Query slices whose values, copied once per query by the engine, fit in the memory budget.

    ``values`` is ``[batch, key, head_index, d_head]``; per query the engine
    holds about three float32-or-wider copies of it (input rows, sorted
    contributions, prefix sums). For ``query_positions="last"`` this is one slice.
    """
    per_query = 3 * values.numel() * max(4, values.element_size())
    size = max(1, int(budget_mib * 2**20 // per_query))
    return [slice(start, start + size) for start in range(0, n_queries, size)]


def analyse_prepared(
    model: HookableModel, prepared: PreparedTokens, config: GeometryConfig, grid: Int[Tensor, " n"]
) -> GeometryResult:
    """One forward pass with the geometry hooks on prepared tokens and a fixed grid."""
    layers, heads, n_heads, n_kv = _model_shape(model, config)
    state = _LayerAnalysis(
        prepared=prepared,
        config=config,
        grid=grid,
        heads=torch.tensor(heads, dtype=torch.long),
        kv_heads=kv_head_of(torch.tensor(heads, dtype=torch.long), n_heads, n_kv),
        n_heads=n_heads,
        n_kv=n_kv,
        values={},
        out={},
        diagnostics=diagnostic_functions(config.diagnostics),
    )
    fwd_hooks: list[tuple[str, Callable[..., None]]] = []
    for layer in layers:
        fwd_hooks.append((value_hook(layer), partial(state.value_hook, layer=layer)))
        fwd_hooks.append((pattern_hook(layer), partial(state.pattern_hook, layer=layer)))
    kwargs: dict[str, Any] = {"return_type": None}
    if prepared.padded:
        if not _accepts_attention_mask(model):
            raise GeometryError(
                "tokens: the sequences are padded but this model's forward takes no attention_mask; "
                "run the sequences one at a time (batch of 1) or with equal lengths"
            )
        kwargs["attention_mask"] = prepared.real.long()
    device = getattr(model.cfg, "device", None)
    tokens = prepared.tokens if device is None else prepared.tokens.to(device)
    if "attention_mask" in kwargs and device is not None:
        kwargs["attention_mask"] = kwargs["attention_mask"].to(device)
    with torch.inference_mode(), model.hooks(fwd_hooks=fwd_hooks):
        model(tokens, **kwargs)
    silent = [layer for layer in layers if layer not in state.out]
    if silent:
        raise GeometryError(
            f"hooks {[pattern_hook(layer) for layer in silent]} never fired; the model's forward pass skipped "
            "these layers' attention (check stop_at_layer or the model's attention implementation)"
        )
    per_sequence = {
        name: torch.stack([state.out[layer][name] for layer in layers], dim=1) for name in state.out[layers[0]]
    }
    return result_from_parts(
        per_sequence,
        n_grid=grid,
        layers=layers,
        heads=heads,
        sequence_lengths=prepared.real.sum(-1).cpu(),
        config=config,
        model_name=str(getattr(model.cfg, "model_name", type(model).__name__)),
    )


def run_with_geometry_hooks(
    model: HookableModel,
    tokens: TokensLike,
    *,
    config: GeometryConfig | None = None,
    attention_mask: Int[Tensor, "batch pos"] | Bool[Tensor, "batch pos"] | None = None,
    **overrides: Any,
) -> GeometryResult:
    """Selection metrics of every analysed layer and head, from one forward pass with hooks.

    Args:
        model: a TransformerLens model (HookedTransformer, TransformerBridge
            with or without compatibility mode); left exactly as it was.
        tokens: token ids ``[batch, pos]`` (used as given), a string, or a
            list of strings (tokenised one by one with BOS prepended unless
            ``prepend_bos=False``, then right-padded).
        config: the GeometryConfig (default ``GeometryConfig()``).
        attention_mask: for padded token tensors, 1 for real tokens (left or
            right padding); without it every token counts as real.
        **overrides: config fields to replace, e.g. ``layers=[0]``.

    Returns:
        GeometryResult: per-sequence metrics ``[sequence, layer, head_index, n]``
        (nanmean over each sequence's queries) and their nanmeans over sequences.

    Raises:
        GeometryError: bad tokens, config or layer/head indices, missing hooks.

    Example:
        >>> result = run_with_geometry_hooks(model, "the cat sat", n_grid=[1, 2])  # doctest: +SKIP
        >>> result.precision.shape  # [layer, head_index, n]  # doctest: +SKIP
    """
    config = make_config(config, overrides)
    prepared = prepare_tokens(model, tokens, config, attention_mask)
    grid = config.resolve_n_grid(prepared.max_visible())
    return analyse_prepared(model, prepared, config, grid)
