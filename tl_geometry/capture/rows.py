"""The rows capture path: the model runs its fast attention; only the analysed query rows are built.

The pattern path (`tl_geometry.capture.hooks`) reads ``hook_pattern``, so the
model must build the whole ``[batch, head, query, key]`` pattern of every
layer, although the analysis reads only a few query rows per sequence. Here
the forward pass runs through Hugging Face's attention interface instead:

- the wrapped Hugging Face model (``model.original_model`` of a
  TransformerBridge) runs with ``config._attn_implementation`` set to a
  registered attention function, ``"tl_geometry_rows"``, for the one pass;
- that function returns the model's fast attention (SDPA; eager where the
  model softcaps its scores, which SDPA cannot) as the layer's output, and
  calls the model's own ``eager_attention_forward`` (from its modeling module:
  scaling, softcapping, sliding-window and padding masks, grouped-query
  ``repeat_kv``, all as the model does them) on the analysed query rows only;
- those rows and the layer's value states go to the same layer analysis the
  pattern hook runs (`tl_geometry.capture.layer_analysis`), which
  analyses several layers' rows at once.

Why not the bridge's own forward: TransformerLens 4.x's attention bridges
re-implement attention for rotary models (they compute the pattern
themselves to fire ``hook_pattern``), so whatever the configured attention
is, the bridge's pass builds every pattern. Queries and keys reach the
attention function after QK-norm and rotary, so those stay the model's own code.

Models whose attention does not go through the interface (Bloom's ALiBi,
GPT-J, HookedTransformer) raise a GeometryError naming the pattern path;
`why_not_rows` says, before a pass, whether a model can take this path (the
default ``capture="auto"`` asks it).
"""

import inspect
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tl_geometry.errors import GeometryError

ROWS_ATTENTION = "tl_geometry_rows"
# The attribute that carries a pass's RowsCapture on each attention module for the pass's duration (as a
# TransformerLens hook keeps its state on the hook point): nothing of a pass lives in a module global, so
# passes of different models may run at once, in threads.
ROWS_CAPTURE = "_tl_geometry_rows_capture"


class RowsCapture:
    """What one pass's attention function needs: the analysed query positions and a callback per layer.

    Args:
        query_index: position of each analysed query in its padded row, ``[batch, query]``.
        analyse: called per layer as ``analyse(layer, rows, values)`` with the attention rows
            ``[batch, n_heads, query, key]`` and the value states ``[batch, key, n_kv_heads, d_head]``.
        layers: the layers to analyse (other layers only run the fast attention).
    """

    def __init__(
        self,
        query_index: Int[Tensor, "batch query"],
        analyse: Callable[[int, Tensor, Tensor], None],
        layers: tuple[int, ...],
    ) -> None:
        self.query_index = query_index
        self.analyse = analyse
        self.layers = frozenset(layers)
        self.seen: set[int] = set()


def hf_model_of(model: Any) -> Any:
    """The Hugging Face model a TransformerBridge wraps, or GeometryError naming the pattern path."""
    hf = getattr(model, "original_model", None)
    config = getattr(hf, "config", None)
    if hf is None or not hasattr(config, "_attn_implementation"):
        raise GeometryError(
            f'capture="rows": {type(model).__name__} wraps no Hugging Face model whose attention goes through '
            'its attention interface (only a TransformerBridge does); use capture="pattern"'
        )
    return hf


def why_not_rows(model: Any) -> str | None:
    """Why ``model`` cannot take the rows path as it stands, or None if it can.

    It can when it wraps a Hugging Face model (a TransformerBridge) whose every
    attention module's modeling file has ``eager_attention_forward`` (Bloom
    and GPT-J compute attention in their own code) and no hook is attached to
    it: the rows pass does not fire ``hook_v`` or ``hook_pattern``, so a hook
    the user attached there would be skipped without a word.
    """
    try:
        hf_model_of(model)
    except GeometryError:
        return f"{type(model).__name__} wraps no Hugging Face model with an attention interface"
    for bridge in _attention_bridges(model):
        try:
            _eager_function(bridge.original_component)
        except GeometryError:
            return f"{type(bridge.original_component).__name__} computes its attention in its own code"
    hooked = sorted(name for name, point in model.hook_dict.items()
                    if getattr(point, "_forward_hooks", None) or getattr(point, "_forward_pre_hooks", None))
    if hooked:
        return f"hooks are attached to the model ({', '.join(hooked[:3])}{', ...' if len(hooked) > 3 else ''})"
    return None


def _eager_function(module: torch.nn.Module) -> Callable[..., tuple[Tensor, Tensor]]:
    """The model's own ``eager_attention_forward`` from the module's modeling file."""
    function = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if function is None:
        raise GeometryError(
            f'capture="rows": {type(module).__name__} has no eager_attention_forward in its modeling module; '
            'use capture="pattern" for this model'
        )
    return function


def additive_rows_mask(
    mask: Tensor | None, query_index: Int[Tensor, "batch query"], n_keys: int, dtype: torch.dtype
) -> Float[Tensor, "batch 1 query key"]:
    """The eager (additive) mask of the analysed query rows, from the mask the model built for its fast attention.

    ``mask`` is what the fast attention received: a boolean ``[batch, 1, q, k]``
    (True: may attend), an additive float mask, or None, which SDPA reads as
    plain causal attention (the model passes None only when nothing else is masked).
    """
    device = query_index.device
    if mask is None:
        keys = torch.arange(n_keys, device=device)
        allowed = keys[None, None, None, :] <= query_index[:, None, :, None]
    else:
        mask = mask.expand(query_index.shape[0], -1, -1, -1)
        index = query_index[:, None, :, None].expand(-1, mask.shape[1], -1, mask.shape[-1])
        rows = mask.gather(2, index.to(mask.device))[..., :n_keys]
        if rows.dtype == torch.bool:
            allowed = rows
        else:
            return rows.to(dtype)
    # float32's minimum, not float64's: eager attention takes its softmax in float32, where float64's minimum is
    # -inf and a fully masked row (a pad query) would turn NaN and spread through the padded keys' values.
    blocked = torch.finfo(torch.float32 if dtype == torch.float64 else dtype).min
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, blocked)


def rows_attention(
    module: torch.nn.Module,
    query: Float[Tensor, "batch head q d_head"],
    key: Float[Tensor, "batch kv_head k d_head"],
    value: Float[Tensor, "batch kv_head k d_head"],
    attention_mask: Tensor | None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """The registered attention function: the fast attention's output; the analysed rows to the layer analysis."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    eager = _eager_function(module)
    # SDPA cannot softcap scores (Gemma 2): there the model's eager attention is its output as well.
    softcapped = getattr(module, "attn_logit_softcapping", None) is not None or kwargs.get("softcap") is not None
    if softcapped:  # eager adds its mask: SDPA's boolean mask (or None, "causal") made additive first
        every_query = torch.arange(query.shape[2], device=query.device).expand(query.shape[0], -1)
        output, _ = eager(module, query, key, value, additive_rows_mask(attention_mask, every_query, key.shape[-2],
                                                                        query.dtype), **kwargs)
    else:
        output, _ = ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, **kwargs)
    capture = module.__dict__.get(ROWS_CAPTURE)
    layer = getattr(module, "layer_idx", None)
    if capture is None or layer is None or layer not in capture.layers:
        return output, None
    capture.seen.add(layer)
    index = capture.query_index.to(query.device)
    rows_query = query.gather(2, index[:, None, :, None].expand(-1, query.shape[1], -1, query.shape[-1]))
    mask = additive_rows_mask(attention_mask, index, key.shape[-2], query.dtype)
    eager_kwargs = {k: v for k, v in kwargs.items() if k not in ("is_causal", "dropout")}
    _, rows = eager(module, rows_query, key, value, mask, dropout=0.0, **eager_kwargs)
    capture.analyse(layer, rows, value.transpose(1, 2))
    return output, None


def _rows_mask(*args: Any, **kwargs: Any) -> Any:
    """The mask builder of the rows attention: SDPA's (the fast attention receives it)."""
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, **kwargs)


def register_rows_attention() -> None:
    """Register ``"tl_geometry_rows"`` with Hugging Face's attention and mask interfaces (idempotent)."""
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(ROWS_ATTENTION, rows_attention)
    AttentionMaskInterface.register(ROWS_ATTENTION, _rows_mask)


def _configs(hf: Any) -> list[Any]:
    """The model's config and its sub-configs (text configs of composite models)."""
    configs = [hf.config]
    for name in ("text_config", "decoder"):
        sub = getattr(hf.config, name, None)
        if sub is not None and hasattr(sub, "_attn_implementation"):
            configs.append(sub)
    return configs


def _attention_bridges(model: Any) -> list[Any]:
    """The bridge's attention components that wrap a Hugging Face attention module."""
    from transformer_lens.model_bridge.generalized_components.attention import AttentionBridge

    return [m for m in model.modules() if isinstance(m, AttentionBridge) and m.original_component is not None]


@contextmanager
def rows_attention_active(model: Any, hf: Any, capture: RowsCapture) -> Iterator[None]:
    """For the block's duration: the model's attention is the rows attention, feeding ``capture``; restored after.

    Each attention bridge runs the base ``AttentionBridge.forward`` (hook_in, the
    Hugging Face module, hook_out) in place of its re-implementation, which
    would build the whole pattern; the instance attribute is deleted after.
    """
    from transformer_lens.model_bridge.generalized_components.attention import AttentionBridge

    register_rows_attention()
    configs = _configs(hf)
    before = [c._attn_implementation for c in configs]
    bridges = _attention_bridges(model)
    # The modules the rows attention is called with: each layer's attention (those with a layer_idx).
    carriers = {id(m): m for m in [*hf.modules(), *(b.original_component for b in bridges)] if hasattr(m, "layer_idx")}
    try:
        for module in carriers.values():
            module.__dict__[ROWS_CAPTURE] = capture  # not setattr: a module's own __setattr__ may pass it on
        for c in configs:
            c._attn_implementation = ROWS_ATTENTION
        for bridge in bridges:
            # object.__setattr__: the bridge's own __setattr__ would pass the attribute on to the HF module.
            object.__setattr__(bridge, "forward", types.MethodType(AttentionBridge.forward, bridge))
        yield
    finally:
        for bridge in bridges:
            bridge.__dict__.pop("forward", None)
        for c, implementation in zip(configs, before):
            c._attn_implementation = implementation
        for module in carriers.values():
            module.__dict__.pop(ROWS_CAPTURE, None)


def position_ids(real: torch.Tensor) -> Int[Tensor, "batch pos"]:
    """Positions counted from each sequence's first real token, as the bridge derives them from the mask."""
    return (real.long().cumsum(-1) - 1).clamp(min=0)


def run_rows_pass(model: Any, tokens: Tensor, real: Tensor | None, capture: RowsCapture) -> None:
    """One forward pass of the bridge's Hugging Face decoder (no unembedding) with the rows attention."""
    hf = hf_model_of(model)
    base = getattr(hf, "base_model", hf)
    kwargs: dict[str, Any] = {"use_cache": False}
    if real is not None:
        kwargs["attention_mask"] = real.long()
        if "position_ids" in inspect.signature(base.forward).parameters:
            kwargs["position_ids"] = position_ids(real)
    with torch.inference_mode(), rows_attention_active(model, hf, capture):
        base(input_ids=tokens, **kwargs)
    silent = sorted(capture.layers - capture.seen)
    if silent:
        raise GeometryError(
            f'capture="rows": the attention of layers {silent} did not go through Hugging Face\'s attention '
            f"interface ({type(hf).__name__} computes it in its own code); use capture=\"pattern\" for this model"
        )
