"""From a Hugging Face model to a TransformerLens model: a ``TransformerBridge`` around it or a
``HookedTransformer`` with its weights; TransformerLens's own loader for other names; and the last steps every
loaded model takes (cast, eval mode, no gradients).
"""

import importlib.metadata
from typing import Any

import torch

from tl_geometry.errors import GeometryError, first_line
from tl_geometry.models.names import bundled_model_names

# HookedTransformer (3.x) allocates an n_ctx x n_ctx causal mask per layer: at the
# model's 8192 positions that is 2 GB, so the hooked kind is built for 2048 positions.
_HOOKED_N_CTX = 2048


def transformer_lens_major_version() -> int:
    """Major version of the installed transformer-lens (3 or 4 in practice).

    Returns:
        The leading integer of ``transformer-lens``'s version string.
    """
    return int(importlib.metadata.version("transformer-lens").split(".")[0])


def bridge_from_hf(
    name: str,
    hf_model: Any,
    tokenizer: Any,
    device: str | torch.device,
    compatibility_mode: bool,
) -> torch.nn.Module:
    """Wrap a loaded Hugging Face model in a ``TransformerBridge``.

    The tokenizer is passed explicitly: without it the boot would fetch one from the hub.
    """
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(
        name, hf_model=hf_model, tokenizer=tokenizer, device=device
    )
    if compatibility_mode:
        bridge.enable_compatibility_mode(disable_warnings=True)
    return bridge


def _rope_theta(hf_config: Any) -> float:
    """Rotary base of a Hugging Face config (``rope_parameters`` in transformers 5)."""
    parameters = getattr(hf_config, "rope_parameters", None)
    if isinstance(parameters, dict) and "rope_theta" in parameters:
        return float(parameters["rope_theta"])
    theta = getattr(hf_config, "rope_theta", None)
    if theta is None:
        raise GeometryError(
            "load_model(kind='hooked'): the Hugging Face config has neither "
            "rope_parameters['rope_theta'] nor rope_theta; use kind='bridge'."
        )
    return float(theta)


def hooked_from_hf(
    name: str, hf_model: Any, tokenizer: Any, device: str | torch.device
) -> torch.nn.Module:
    """A ``HookedTransformer`` with the weights of a Llama-architecture HF model.

    The config is built by hand (TransformerLens has no entry for these names) and the
    weights go through TransformerLens's Llama conversion and its default processing
    (fold_ln, centred writing weights and unembedding), as ``from_pretrained`` would.
    """
    import warnings

    from transformer_lens import HookedTransformer
    from transformer_lens.pretrained.weight_conversions import convert_llama_weights

    hf_config = hf_model.config
    if hf_config.model_type != "llama":
        raise GeometryError(
            f"load_model({name!r}, kind='hooked'): only Llama-architecture models can be "
            f"built as HookedTransformer here, this one is {hf_config.model_type!r}; "
            "use kind='bridge'."
        )
    cfg = _hooked_config(name, hf_config, device)
    with warnings.catch_warnings():
        # 3.x warns that HookedTransformer is deprecated; the caller asked for it.
        warnings.simplefilter("ignore", DeprecationWarning)
        model = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=True)
    # convert_llama_weights reads lm_head, which is the (tied) embedding for SmolLM2.
    model.load_and_process_state_dict(convert_llama_weights(hf_model, cfg))
    return model


def _hooked_config(name: str, hf_config: Any, device: str | torch.device) -> Any:
    """``HookedTransformerConfig`` equivalent to a Llama Hugging Face config."""
    from transformer_lens import HookedTransformerConfig

    n_kv = hf_config.num_key_value_heads
    d_head = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    return HookedTransformerConfig(
        model_name=name,
        original_architecture="LlamaForCausalLM",
        d_model=hf_config.hidden_size,
        d_head=d_head,
        n_heads=hf_config.num_attention_heads,
        # TransformerLens treats None as "no grouping".
        n_key_value_heads=n_kv if n_kv != hf_config.num_attention_heads else None,
        d_mlp=hf_config.intermediate_size,
        n_layers=hf_config.num_hidden_layers,
        n_ctx=min(hf_config.max_position_embeddings, _HOOKED_N_CTX),
        eps=hf_config.rms_norm_eps,
        d_vocab=hf_config.vocab_size,
        act_fn=hf_config.hidden_act,
        normalization_type="RMS",
        final_rms=True,
        gated_mlp=True,
        positional_embedding_type="rotary",
        rotary_dim=d_head,
        rotary_adjacent_pairs=False,
        rotary_base=_rope_theta(hf_config),
        default_prepend_bos=True,
        dtype=torch.float32,
        device=str(device),
    )


def load_by_name(
    name: str, *, kind: str, device: str | torch.device, compatibility_mode: bool, dtype: torch.dtype
) -> torch.nn.Module:
    """Load ``name`` with TransformerLens's own loader, with a one-line error on failure."""
    try:
        if kind == "hooked":
            import warnings

            from transformer_lens import HookedTransformer

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                return HookedTransformer.from_pretrained(name, device=device, dtype=dtype)
        from transformer_lens.model_bridge import TransformerBridge

        bridge = TransformerBridge.boot_transformers(name, device=device, dtype=dtype)
    except Exception as error:  # noqa: BLE001 - any loader failure gets one clear message
        reason = first_line(error)
        raise GeometryError(
            f"load_model({name!r}): TransformerLens could not load it ({type(error).__name__}: "
            f"{reason}). Offline models: {', '.join(bundled_model_names())}; other names "
            "need network access to the Hugging Face hub or a copy in its local cache."
        ) from None
    if compatibility_mode:
        bridge.enable_compatibility_mode(disable_warnings=True)
    return bridge


def ready_for_analysis(model: torch.nn.Module, name: str, dtype: torch.dtype) -> torch.nn.Module:
    """Eval mode, no gradients, and a check that the weights really are in ``dtype``."""
    model.eval()
    model.requires_grad_(False)
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if dtypes != {dtype}:
        raise GeometryError(
            f"load_model({name!r}): expected {dtype} weights, found {sorted(map(str, dtypes))}; "
            "this is a bug in tl_geometry.models, please report it."
        )
    return model


def cast_weights(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """The model with ``dtype`` weights, its config saying so (TransformerLens reads ``cfg.dtype``).

    TransformerLens's own ``model.to(dtype)`` ends in ``torch.nn.Module.to`` too, but first rebuilds the
    whole state dict once per tensor (6.8 s of a 10 s bfloat16 load of SmolLM2 on one CPU thread) and
    prints. On the bundled models every tensor of the wrapped Hugging Face model is reached through the
    bridge's own modules.
    """
    if dtype == torch.float32:
        return model
    torch.nn.Module.to(model, dtype)
    if hasattr(model.cfg, "dtype"):
        model.cfg.dtype = dtype
    return model
