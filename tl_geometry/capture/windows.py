"""Sliding-window attention: which layers have a window, and which keys a query sees there.

Some models attend through a window on some layers: Gemma-3 (five of every six
layers, window 512 on Gemma-3-270M), Gemma-2 (every other layer), Mistral and
Phi-3 (every layer). On such a layer a query sees only the last ``window`` keys,
itself included, not the whole causal prefix.

Semantics (checked on transformers 5.23.0 and transformer-lens 3.9.0 / 4.3.0):
with window ``W`` a query at row index ``q`` sees key ``k`` iff

    q - W < k <= q        (W keys, the query's own included)

and ``k`` is a real token. Sources:

- transformers ``masking_utils.py``: ``causal_mask_function`` returns
  ``kv_idx <= q_idx`` (line 76); ``sliding_window_overlay`` returns
  ``kv_idx > q_idx - sliding_window`` (line 95); ``sliding_window_causal_mask_function``
  is their AND (line 134); the docstring of ``sdpa_mask`` (line 496) shows it for
  W = 3: row 3 sees keys 1, 2, 3. Gemma-3 builds that mask for its
  ``"sliding_attention"`` layers (``models/gemma3/modeling_gemma3.py`` line 543)
  with ``config.sliding_window`` (line 324).
- transformer-lens 3.9 ``HookedTransformer`` (``components/abstract_attention.py``
  lines 659-667): ``key <= query`` and ``key > query - cfg.window_size`` on
  ``attn_type == "local"`` layers.
- ``TransformerBridge`` (3.9 and 4.3, ``generalized_components/attention.py``,
  ``_apply_reconstruct_attention_mask``) applies the 4D mask Hugging Face built
  as is, so a bridge inherits the Hugging Face semantics above.

Padding: the indices ``q`` and ``k`` are row indices in the padded row, not
position ids (``masking_utils.py`` lines 545-546: ``arange(q_length)``,
``arange(kv_length)``); padding is masked separately (``padding_mask_function``,
line 173). With left padding the pads sit before the first real token, so
``q - k`` between real tokens is the same whether counted from the start of the
row or from the first real token: counting on row indices, as `visible_keys`
does, matches the model. ``tests/test_windows.py`` checks this against the
attention pattern of Gemma-3-270M, with and without left padding.
"""

from typing import Any

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from tl_geometry.errors import GeometryError

# Hugging Face ``layer_types`` entries (transformers 5.x) and what they mean here.
_SLIDING_LAYER_TYPE = "sliding_attention"
_GLOBAL_LAYER_TYPE = "full_attention"
# TransformerLens ``cfg.attn_types`` entries (HookedTransformer, GPT-Neo style).
_LOCAL_ATTN_TYPE, _GLOBAL_ATTN_TYPE = "local", "global"


def visible_keys(
    query_index: Int[Tensor, "batch query"], real: Bool[Tensor, "batch key"], window: int | None
) -> Bool[Tensor, "batch query key"]:
    """Keys each query can see: causal (k <= q), real, and inside the window (k > q - window).

    Args:
        query_index: position of each query in its (padded) row.
        real: which positions of each row hold real tokens (one contiguous run:
            left or right padding).
        window: the layer's sliding-window size, or None for a global layer.

    Returns:
        ``[batch, query, key]``, True where the query attends to the key.

    Raises:
        GeometryError: a window that is not a positive integer; a query index
            outside the row.

    >>> real = torch.tensor([[False, True, True, True, True]])  # one pad on the left
    >>> visible_keys(torch.tensor([[4]]), real, window=2).int().tolist()
    [[[0, 0, 0, 1, 1]]]
    >>> visible_keys(torch.tensor([[4]]), real, window=None).int().tolist()
    [[[0, 1, 1, 1, 1]]]
    """
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise GeometryError(f"window: expected a positive integer or None (global layer), got {window!r}")
    n_keys = real.shape[-1]
    if query_index.numel() and (int(query_index.min()) < 0 or int(query_index.max()) >= n_keys):
        raise GeometryError(
            f"query_index: positions must lie in the row, 0..{n_keys - 1} (real has {n_keys} keys), "
            f"got {int(query_index.min())}..{int(query_index.max())}"
        )
    keys = torch.arange(n_keys, device=real.device)
    query = query_index.to(real.device).unsqueeze(-1)  # [batch, query, 1]
    visible = (keys <= query) & real[:, None, :]
    if window is not None:
        visible &= keys > query - window
    return visible


def attention_windows(model: Any) -> tuple[int | None, ...]:
    """Sliding-window size of every layer of a TransformerLens model, None for global layers.

    Read from the model's own config:

    - a ``TransformerBridge`` (transformer-lens 3.9 and 4.x, with or without
      compatibility mode) runs the wrapped Hugging Face model's masks, so its
      config decides: ``layer_types`` (``"sliding_attention"`` layers get
      ``sliding_window``), else the older ``sliding_window_pattern`` (every
      pattern-th layer is global), else ``sliding_window`` on every layer
      (Mistral, Phi-3); GPT-Neo's ``attention_layers`` and ``window_size`` too.
      Heterogeneous configs (transformers >= 5.15) are read layer by layer.
    - a ``HookedTransformer`` (transformer-lens 3.x): ``cfg.use_local_attn``,
      ``cfg.attn_types`` (``"local"`` / ``"global"``) and ``cfg.window_size``.

    Args:
        model: a TransformerLens model.

    Returns:
        One entry per layer (``cfg.n_layers``): the window size ``W`` (the
        query sees the ``W`` keys ending at itself, see `visible_keys`) or None.

    Raises:
        GeometryError: the model has no ``cfg.n_layers``; a config that asks for
            windows without a usable size, or names a layer type this package
            does not know (e.g. chunked attention).

    >>> model = load_model("gemma3-270m")  # doctest: +SKIP
    >>> attention_windows(model)[:6]  # doctest: +SKIP
    (512, 512, 512, 512, 512, None)
    """
    cfg = getattr(model, "cfg", None)
    n_layers = getattr(cfg, "n_layers", None)
    if not isinstance(n_layers, int) or n_layers < 1:
        raise GeometryError(
            f"model: expected a TransformerLens model with cfg.n_layers, got {type(model).__name__} "
            f"with n_layers={n_layers!r}"
        )
    hf_config = _hf_text_config(model)
    if hf_config is not None:
        return _windows_from_hf(hf_config, n_layers)
    return _windows_from_tl(cfg, n_layers)


def _hf_text_config(model: Any) -> Any:
    """The wrapped Hugging Face model's (text) config on a bridge, else None.

    Both bridge versions keep the Hugging Face model in ``model.original_model``
    (a property that raises AttributeError until it is set).
    """
    hf_model = getattr(model, "original_model", None)
    config = getattr(hf_model, "config", None)
    if config is None:
        return None
    # Multimodal wrappers (e.g. Gemma3ForConditionalGeneration) nest the text model's config.
    get_text_config = getattr(config, "get_text_config", None)
    return get_text_config() if callable(get_text_config) else config


def _layer_configs(config: Any, n_layers: int) -> list[Any]:
    """One config per layer: heterogeneous configs refuse per-layer fields globally."""
    if getattr(config, "is_heterogeneous", False):
        per_layer = config.per_layer_config
        return [per_layer[i] for i in range(n_layers)]
    return [config] * n_layers


def _check_window(window: Any, source: str) -> int:
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise GeometryError(
            f"model: {source} asks for a sliding window but its size is {window!r}, not a positive integer"
        )
    return window


def _windows_from_hf(config: Any, n_layers: int) -> tuple[int | None, ...]:
    layer_configs = _layer_configs(config, n_layers)
    windows: list[int | None] = []
    for layer, layer_config in enumerate(layer_configs):
        is_sliding = _hf_layer_is_sliding(layer_config, layer, n_layers)
        if is_sliding is None:  # GPT-Neo spells its windows differently
            windows.append(_gpt_neo_window(layer_config, layer, n_layers))
        elif is_sliding:
            source = f"layer {layer}'s Hugging Face config"
            windows.append(_check_window(getattr(layer_config, "sliding_window", None), source))
        else:
            windows.append(None)
    return tuple(windows)


def _hf_layer_is_sliding(config: Any, layer: int, n_layers: int) -> bool | None:
    """Whether a layer is a sliding-window layer per a Hugging Face config; None if it has no say."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        # Models index layer_types[i] for i < num_hidden_layers; longer lists are allowed.
        if len(layer_types) < n_layers:
            raise GeometryError(
                f"model: the Hugging Face config lists {len(layer_types)} layer_types for {n_layers} layers"
            )
        kind = layer_types[layer]
        if kind not in (_SLIDING_LAYER_TYPE, _GLOBAL_LAYER_TYPE):
            raise GeometryError(
                f"model: layer {layer} has attention type {kind!r}; tl_geometry knows only "
                f"{_GLOBAL_LAYER_TYPE!r} and {_SLIDING_LAYER_TYPE!r}"
            )
        return kind == _SLIDING_LAYER_TYPE
    if getattr(config, "sliding_window", None) is None:
        return None
    # Before layer_types, Gemma-3 and Cohere-2 configs gave a period: every
    # pattern-th layer is global (configuration_gemma3.py line 110).
    pattern = getattr(config, "sliding_window_pattern", None) or getattr(config, "_sliding_window_pattern", None)
    if pattern is not None:
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            raise GeometryError(f"model: sliding_window_pattern must be a positive integer, got {pattern!r}")
        return bool((layer + 1) % pattern)
    return True  # Mistral, Phi-3: one window on every layer


def _gpt_neo_window(config: Any, layer: int, n_layers: int) -> int | None:
    """GPT-Neo: ``attention_layers`` of "global"/"local" and one ``window_size`` (as TransformerLens 3.x reads it)."""
    attention_layers = getattr(config, "attention_layers", None)
    if attention_layers is None:
        return None
    window_size = getattr(config, "window_size", None)
    return _windows_from_types(attention_layers, window_size, n_layers, "attention_layers")[layer]


def _windows_from_tl(cfg: Any, n_layers: int) -> tuple[int | None, ...]:
    if not getattr(cfg, "use_local_attn", False):
        return (None,) * n_layers
    attn_types, window_size = getattr(cfg, "attn_types", None), getattr(cfg, "window_size", None)
    return _windows_from_types(attn_types, window_size, n_layers, "cfg.attn_types")


def _windows_from_types(types: Any, window_size: Any, n_layers: int, source: str) -> tuple[int | None, ...]:
    """Windows from a per-layer list of "local"/"global" and one window size."""
    if types is None or len(types) < n_layers:
        raise GeometryError(
            f"model: local attention is on but {source} = {types!r} does not cover {n_layers} layers"
        )
    windows: list[int | None] = []
    for layer, kind in enumerate(types[:n_layers]):
        if kind == _LOCAL_ATTN_TYPE:
            windows.append(_check_window(window_size, f"{source}[{layer}]"))
        elif kind == _GLOBAL_ATTN_TYPE:
            windows.append(None)
        else:
            raise GeometryError(
                f"model: {source}[{layer}] is {kind!r}; expected {_LOCAL_ATTN_TYPE!r} or {_GLOBAL_ATTN_TYPE!r}"
            )
    return tuple(windows)
