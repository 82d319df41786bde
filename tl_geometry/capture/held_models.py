"""Models users already hold: a plain ``transformers`` causal LM or an nnsight model, wrapped once for the hooks.

`run_with_geometry_hooks`, `analyze_corpus`, `classify_heads`, the
interventions (`intervention_sweep`, `effective_set_size`), the head
ablations (`ablate_roles`) and `published_measures` take these as they are
and wrap them here into a TransformerLens ``TransformerBridge`` (as
`tl_geometry.load_model` wraps the bundled models), once per call. The
user's model is left exactly as it was: the bridge puts its components into
the module tree it wraps, switches it to eager attention and keeps hooks on
its norms, so it wraps a *shell* of the model instead: a copy of the modules
and the config that shares every parameter and buffer (no weight is copied,
so wrapping costs no memory for the weights). For the same reason the bridge
runs without TransformerLens's weight processing (``enable_compatibility_mode``
folds norms into the weights in place): value vectors and attention patterns
are the model's own, equal to a processed bridge's to float rounding.
The entry points that edit the forward pass (the interventions, the head
ablations) and `published_measures` ask for the bridge's compatibility mode,
still without weight processing: without it the bridge computes attention
inside the wrapped module and fires ``hook_pattern`` after the fact, so an
edited pattern would never reach the logits.

The tokenizer is the one given, else the one an nnsight model carries, else
read from the folder the model was loaded from (``config._name_or_path``);
a copy is used (sharing the vocabulary), because TransformerLens sets the
padding side and special tokens on the tokenizer it gets.

nnsight is imported only when an nnsight model is passed (``pip install
tl_geometry[nnsight]``). Only local models: a model run remotely on NDIF
has no weights here to hook.
"""

import copy
from typing import Any

import torch

from tl_geometry.capture.tokens import HookableModel
from tl_geometry.errors import GeometryError, first_line
from tl_geometry.models.builders import bridge_from_hf


def is_transformers_model(model: Any) -> bool:
    """Whether ``model`` is a plain ``transformers`` model (a ``PreTrainedModel``), checked without importing it."""
    return any(cls.__name__ == "PreTrainedModel" and cls.__module__.startswith("transformers.")
               for cls in type(model).__mro__)


def is_nnsight_model(model: Any) -> bool:
    """Whether ``model`` is an nnsight model wrapper (an ``Envoy``), checked without importing nnsight."""
    return any(cls.__name__ == "Envoy" and cls.__module__.startswith("nnsight.") for cls in type(model).__mro__)


def is_held_model(model: Any) -> bool:
    """Whether ``model`` is one `as_hookable` wraps: a plain ``transformers`` model or an nnsight model."""
    return is_nnsight_model(model) or is_transformers_model(model)


def as_hookable(model: Any, tokenizer: Any = None, *, compatibility_mode: bool = False) -> HookableModel:
    """The model the hooks run on: a TransformerLens model as it is, a held model wrapped (see the module).

    Args:
        model: a TransformerLens model, a ``transformers`` causal LM
            (``PreTrainedModel``), or an nnsight ``LanguageModel`` /
            ``TransformersModel`` around a local model.
        tokenizer: for a ``transformers`` or nnsight model, the tokenizer to
            use (default: the nnsight model's, else the one saved beside the
            model); refused for a TransformerLens model, which carries its own.
        compatibility_mode: wrap a held model in the bridge's compatibility mode, without weight processing,
            so that edits of ``hook_pattern`` and ``hook_z`` reach the logits (see the module).

    Returns:
        The model itself, or a ``TransformerBridge`` over a shell of it.

    Raises:
        GeometryError: a tokenizer given with a TransformerLens model; no
            tokenizer found; an nnsight model that is not local; an
            architecture TransformerLens cannot wrap.
    """
    if is_nnsight_model(model):
        return wrap_held_model(_nnsight_module(model), tokenizer if tokenizer is not None else model.tokenizer,
                               compatibility_mode=compatibility_mode)
    if is_transformers_model(model):
        return wrap_held_model(model, tokenizer, compatibility_mode=compatibility_mode)
    if tokenizer is not None:
        raise GeometryError(
            f"tokenizer: only for a transformers or nnsight model; this {type(model).__name__} carries its own "
            "(model.tokenizer): drop the tokenizer argument"
        )
    return model


def wrap_held_model(hf_model: Any, tokenizer: Any = None, *, compatibility_mode: bool = False) -> HookableModel:
    """A ``TransformerBridge`` over a shell of a ``transformers`` causal LM; the model itself is left as it was.

    Args:
        hf_model: a ``transformers`` ``PreTrainedModel`` with a language-modelling head.
        tokenizer: its tokenizer (default: read from ``hf_model.config._name_or_path``).
        compatibility_mode: enable the bridge's compatibility mode without weight processing, so that edits of
            ``hook_pattern`` and ``hook_z`` reach the logits (what the interventions and ablations need).

    Returns:
        A bridge in eval mode, on the model's device, sharing its weights (the model keeps its own mode).

    Raises:
        GeometryError: no tokenizer found; meta weights; a model a bridge already wraps; an
            architecture TransformerLens cannot wrap.

    >>> bridge = wrap_held_model(hf_model, tokenizer)  # doctest: +SKIP
    >>> bridge.original_model is hf_model, bridge.cfg.n_layers  # doctest: +SKIP
    (False, 30)
    """
    name = str(getattr(hf_model.config, "_name_or_path", "") or type(hf_model).__name__)
    meta = [n for n, p in hf_model.named_parameters() if p.is_meta]
    if meta:
        raise GeometryError(
            f"model: {name} has weights on the meta device ({meta[0]}, ...); load them first (for an nnsight model "
            "call model.dispatch(), or pass dispatch=True when building it)"
        )
    if any(type(module).__module__.startswith("transformer_lens.") for module in hf_model.modules()):
        raise GeometryError(
            f"model: this {type(hf_model).__name__} is already wrapped by a TransformerBridge (its modules hold the "
            "bridge's components); pass that bridge instead"
        )
    tokenizer = _own_tokenizer(tokenizer if tokenizer is not None else _saved_tokenizer(hf_model, name))
    shell = shell_copy(hf_model)
    device = next(hf_model.parameters()).device
    try:
        bridge = bridge_from_hf(name, shell, tokenizer, device, compatibility_mode=False)
        if compatibility_mode:  # no processing: it would fold the norms into the user's own weights, in place
            bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    except Exception as error:  # noqa: BLE001 - any wrapping failure gets one clear message
        reason = first_line(error)
        raise GeometryError(
            f"model: TransformerLens cannot wrap this {type(hf_model).__name__} ({type(error).__name__}: {reason}); "
            "load a model of an architecture TransformerLens supports, or load it with tl_geometry.load_model"
        ) from None
    # The shell's modules are its own: eval mode (no dropout in the analysis) leaves the user's model's mode alone.
    return bridge.eval()


def shell_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``module``'s tree and config that shares every parameter and buffer (no tensor data is copied).

    >>> layer = torch.nn.Linear(2, 2)
    >>> shell = shell_copy(layer)
    >>> shell is layer, shell.weight is layer.weight
    (False, True)
    """
    shared = {id(tensor): tensor for tensor in (*module.parameters(), *module.buffers())}
    # Buffers not registered as such (rotary caches kept as plain attributes) are copied: they are small.
    return copy.deepcopy(module, memo=shared)


def _nnsight_module(model: Any) -> Any:
    """The local ``transformers`` model inside an nnsight wrapper, dispatched (its weights loaded) first."""
    if not getattr(model, "dispatched", True):
        model.dispatch()  # what nnsight does itself on the first trace
    module = getattr(model, "_module", None)
    if not is_transformers_model(module):
        raise GeometryError(
            f"model: this nnsight {type(model).__name__} holds a {type(module).__name__}, not a local transformers "
            "model; build it around one (nnsight.LanguageModel(hf_model, tokenizer=tokenizer) or a local folder). "
            "Remote execution (NDIF) is not supported"
        )
    return module


def _saved_tokenizer(hf_model: Any, name: str) -> Any:
    """The tokenizer saved beside the model (its folder or a name in the Hugging Face cache; never the hub)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name, add_bos_token=True, local_files_only=True)
    except Exception as error:  # noqa: BLE001 - hub, file and format errors all mean "pass it"
        reason = first_line(error, 200)
        raise GeometryError(
            f"tokenizer: none given and none found for {name!r} ({type(error).__name__}: {reason}); pass it: "
            "run_with_geometry_hooks(model, tokens, tokenizer=AutoTokenizer.from_pretrained(...))"
        ) from None


def _own_tokenizer(tokenizer: Any) -> Any:
    """A copy of the tokenizer for the bridge, which sets its padding side and special tokens in place.

    The copy shares the tokenizer's vocabulary (its Rust backend): deep-copying
    Gemma-3's took 15 to 38 s here. TransformerLens changes only Python-side
    settings (the padding side, the special tokens' names), which the copy
    holds apart, unless the tokenizer has no EOS token: then it adds one to the
    vocabulary, and the copy is a whole one. The copy is marked as prepending
    BOS, so that TransformerLens keeps it instead of reading it again by name
    (from the hub); whether it really prepends BOS is detected from its
    output, and TransformerLens prepends it itself where the tokenizer does not.
    """
    settings = ("_special_tokens_map", "_extra_special_tokens", "init_kwargs")
    if getattr(tokenizer, "eos_token_id", None) is None or not all(name in vars(tokenizer) for name in settings):
        own = copy.deepcopy(tokenizer)
    else:
        own = copy.copy(tokenizer)
        for name in settings:
            vars(own)[name] = copy.copy(vars(tokenizer)[name])
    if getattr(own, "bos_token", None) is not None:
        own.init_kwargs["add_bos_token"] = True
    return own
