"""One head's selection metrics from an `ActivationCache`, for users who start from ``model.run_with_cache``.

    logits, cache = model.run_with_cache(tokens)
    m = tl_geometry.selection_metrics_from_cache(cache, layer=5, head=1)  # the last query
    m.precision, m.recall  # [n], one value per N of the grid

The cache must hold the layer's ``hook_pattern`` and ``hook_v`` (the default
``run_with_cache`` keeps every hook). The query reads its keys under the
model's own mask: causal, inside the layer's sliding window where the cache
knows its model (``cache.model``, as TransformerLens sets it), and real
tokens only when ``attention_mask`` is given. Grouped-query attention: query
head ``h`` reads value head ``h // (n_heads / n_kv_heads)``.
"""

from typing import Any

import torch
from torch import Tensor

from tl_geometry.capture.hook_names import pattern_hook, value_hook
from tl_geometry.capture.windows import attention_windows
from tl_geometry.engine.inputs import NGridLike
from tl_geometry.engine.metrics import SelectionMetrics, selection_metrics
from tl_geometry.errors import GeometryError


def _index(name: str, value: int, size: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -size <= value < size:
        raise GeometryError(f"{name}: expected an integer in [{-size}, {size - 1}], got {value!r}")
    return value % size


def _held_layers(cache: Any) -> list[int]:
    """The layers whose attention pattern the cache holds (empty if its names cannot be listed)."""
    try:
        names = list(cache.keys())
    except (AttributeError, TypeError):
        return []
    parts = [name.split(".") for name in names if isinstance(name, str)]
    return sorted(int(p[1]) for p in parts if len(p) == 4 and p[0] == "blocks" and p[1].isdigit()
                  and p[2:] == ["attn", "hook_pattern"])


def _layer(cache: Any, layer: Any) -> int:
    """The layer as TransformerLens reads it (negative from the end); GeometryError when out of the model's range."""
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise GeometryError(f"layer: expected an integer layer index, got {layer!r}")
    n_layers = getattr(getattr(getattr(cache, "model", None), "cfg", None), "n_layers", None)
    if not isinstance(n_layers, int):  # a plain mapping: no model to count layers by
        if layer < 0:
            raise GeometryError(f"layer: {layer} counts from the end, but the cache has no model (cache.model) to "
                                "count its layers; pass a layer index >= 0")
        return layer
    if not -n_layers <= layer < n_layers:
        raise GeometryError(f"layer: {layer} is out of range; the model has {n_layers} layers (cfg.n_layers), use "
                            f"0..{n_layers - 1} (or -{n_layers}..-1, counted from the end)")
    return layer % n_layers


def selection_metrics_from_cache(
    cache: Any,
    layer: int,
    head: int,
    query: int = -1,
    *,
    batch: int = 0,
    attention_mask: Tensor | None = None,
    n_grid: NGridLike = None,
    ranking: str = "attention",
    distance: str = "euclidean",
) -> SelectionMetrics:
    """Precision, Recall, F-scores and radii of one query row of one head, read from an activation cache.

    Args:
        cache: a TransformerLens ``ActivationCache`` (or any mapping of hook
            names to tensors) holding ``blocks.{layer}.attn.hook_pattern``
            ``[batch, head, query, key]`` and ``blocks.{layer}.attn.hook_v``
            ``[batch, pos, kv_head, d_head]``.
        layer: the layer of the query head (negative: from the end, as
            TransformerLens reads ``cache["pattern", -1]``).
        head: the query head.
        query: the query position (negative counts from the end; default the last).
        batch: the sequence of the batch.
        attention_mask: ``[batch, pos]``, 1 on real tokens, for a padded batch
            (pad keys are then neither selected nor counted).
        n_grid: as `tl_geometry.selection_metrics`; N beyond the visible keys gives NaN.
        ranking: as `tl_geometry.selection_metrics`.
        distance: as `tl_geometry.selection_metrics`.

    Returns:
        SelectionMetrics with ``[n]`` fields.

    Raises:
        GeometryError: a layer out of range (the message gives the model's
            layers), a hook missing from the cache (with the names to keep),
            an index out of range, or shapes that do not fit together.
    """
    layer = _layer(cache, layer)
    names = pattern_hook(layer), value_hook(layer)
    missing = [name for name in names if name not in cache]
    if missing:
        raise GeometryError(
            f"cache: no {' or '.join(missing)} (it holds the patterns of layers {_held_layers(cache)}); run "
            f"model.run_with_cache(tokens) without a names_filter, or with names_filter=lambda name: name in "
            f"{list(names)}"
        )
    pattern, values = cache[names[0]], cache[names[1]]
    if pattern.ndim != 4 or values.ndim != 4 or values.shape[:2] != (pattern.shape[0], pattern.shape[-1]):
        raise GeometryError(
            f"cache: {names[0]} {list(pattern.shape)} and {names[1]} {list(values.shape)} do not fit "
            "[batch, head, query, key] and [batch, key, kv_head, d_head]"
        )
    n_batch, n_heads, n_queries, n_keys = pattern.shape
    batch, head = _index("batch", batch, n_batch), _index("head", head, n_heads)
    query = _index("query", query, n_queries)
    n_kv = values.shape[2]
    if n_heads % n_kv:
        raise GeometryError(f"cache: {n_heads} query heads cannot share {n_kv} value heads evenly")
    kv_head = head // (n_heads // n_kv)
    position = query + n_keys - n_queries  # the query's key position (the same when the cache holds every query)
    keys = torch.arange(n_keys, device=pattern.device)
    visible = keys <= position
    model = getattr(cache, "model", None)
    window = attention_windows(model)[layer] if getattr(getattr(model, "cfg", None), "n_layers", None) else None
    if window is not None:
        visible &= keys > position - window
    if attention_mask is not None:
        if tuple(attention_mask.shape) != (n_batch, n_keys):
            raise GeometryError(f"attention_mask: expected shape {[n_batch, n_keys]}, got {list(attention_mask.shape)}")
        visible &= attention_mask[batch].to(device=pattern.device).bool()
    alpha = pattern[batch, head, query].masked_fill(~visible, 0.0)
    # The model's own softmax: a row need not sum to 1 over the keys an attention_mask leaves visible.
    return selection_metrics(alpha, values[batch, :, kv_head], n_grid, key_mask=visible, ranking=ranking,
                             distance=distance, check_sums=False)
