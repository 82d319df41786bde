"""Hook-point names, built in one place.

TransformerLens names the hooks this package reads the same way on every kind
of model: ``blocks.{layer}.attn.hook_v`` (value states) and
``blocks.{layer}.attn.hook_pattern`` (post-softmax attention). On a
TransformerBridge without compatibility mode these are aliases: the hook point
behind ``hook_v`` calls itself ``blocks.{layer}.attn.v.hook_out``, so code must
never parse the layer back out of ``hook.name``; hooks are bound to their layer
when they are made.
"""


def value_hook(layer: int) -> str:
    """Name of the value-state hook of a layer, ``[batch, pos, kv_head, d_head]``."""
    return f"blocks.{layer}.attn.hook_v"


def pattern_hook(layer: int) -> str:
    """Name of the attention-pattern hook of a layer, ``[batch, head_index, query_pos, key_pos]``."""
    return f"blocks.{layer}.attn.hook_pattern"


def z_hook(layer: int) -> str:
    """Name of the attention-output hook of a layer (pattern @ values), ``[batch, pos, head_index, d_head]``."""
    return f"blocks.{layer}.attn.hook_z"
