"""Head roles on a model: the run behind `classify_heads` and `detect_role`.

`tl_geometry.analysis.head_roles` reads a result; this module runs the model
(with the ``"roles"`` diagnostic added to the run's config) and hands the
result to it. Prompt sets whose mechanism the field knows, to check the roles
against, are `tl_geometry.roles.prompt_sets`.
"""

import math
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from tl_geometry._renamed import old_names, renamed_keyword
from tl_geometry.analysis.head_roles import NAMED, HeadRoles, RoleConfig, roles_from_result
from tl_geometry.capture.held_models import is_held_model
from tl_geometry.capture.hooks import run_with_geometry_hooks
from tl_geometry.capture.tokens import HookableModel, check_model
from tl_geometry.config import GeometryConfig
from tl_geometry.errors import GeometryError
from tl_geometry.results.result import GeometryResult


def with_roles(config: GeometryConfig | None) -> GeometryConfig:
    """``config`` (default ``GeometryConfig()``) with the ``"roles"`` diagnostic among its diagnostics."""
    if config is None:
        return GeometryConfig(diagnostics=("roles",))
    if not isinstance(config, GeometryConfig):
        raise GeometryError(f"config: expected a GeometryConfig or None, got {type(config).__name__}")
    if "roles" not in config.diagnostics:
        config = config.with_overrides(diagnostics=(*config.diagnostics, "roles"))
    return config


def classify_heads(
    result_or_model: Any, tokens: Any = None, config: GeometryConfig | None = None, *, role_config: Any = None,
    tokenizer: Any = None, taxonomy: Any = None,
) -> HeadRoles:
    """The role of every analysed head (Retriever, Mixer, Reset, Content or uncertain), with its probabilities.

    Args:
        result_or_model: a GeometryResult computed with ``"roles"`` in its
            diagnostics, or a model (then ``tokens`` is required): a
            TransformerLens model, a ``transformers`` causal LM or an nnsight
            ``LanguageModel`` (wrapped as `run_with_geometry_hooks` wraps it).
        tokens: for a model: token ids ``[batch, pos]``, a string or a list of
            strings; each sequence is one document of the bootstrap.
        config: for a model: the GeometryConfig of the run (``"roles"`` is added).
        role_config: the RoleConfig (the rules' thresholds); default ``RoleConfig()``.
        tokenizer: for a ``transformers`` or nnsight model, its tokenizer (as in `run_with_geometry_hooks`).
        taxonomy: deprecated: ``role_config``'s former name.

    Returns:
        HeadRoles: ``labels`` ``[layer, head_index]`` indexing ``ROLE_LABELS``,
        ``probabilities`` ``[layer, head_index, role]``.
    """
    role_config = renamed_keyword("classify_heads", "taxonomy", "role_config", taxonomy, role_config, GeometryError)
    if role_config is not None and not isinstance(role_config, RoleConfig):
        raise GeometryError(f"role_config: expected a RoleConfig or None, got {type(role_config).__name__}")
    if isinstance(result_or_model, GeometryResult):
        if tokens is not None or config is not None or tokenizer is not None:
            raise GeometryError(
                "tokens/config/tokenizer: only used with a model; the GeometryResult is already computed, call "
                "classify_heads(result) alone"
            )
        return roles_from_result(result_or_model, role_config)
    if isinstance(result_or_model, HookableModel) or is_held_model(result_or_model):
        if tokens is None:
            raise GeometryError(
                "tokens: required when classify_heads gets a model; pass text or token ids, "
                "e.g. classify_heads(model, 'some text')"
            )
        result = run_with_geometry_hooks(result_or_model, tokens, config=with_roles(config), tokenizer=tokenizer)
        return roles_from_result(result, role_config)
    raise GeometryError(
        f"result_or_model: expected a GeometryResult, a TransformerLens model, a transformers causal LM or an "
        f"nnsight LanguageModel, got {type(result_or_model).__name__}"
    )


def detect_role(
    model: Any,
    seq: Any,
    role: str | None = None,
    heads: list[tuple[int, int]] | dict[int, list[int]] | None = None,
    *,
    config: GeometryConfig | None = None,
    role_config: RoleConfig | None = None,
    regime: str | None = None,
    taxonomy: RoleConfig | None = None,
) -> Float[Tensor, "n_layers n_heads"]:
    """Every head's probability of one role, shaped like ``transformer_lens.head_detector.detect_head``.

    Args:
        model: a TransformerLens model.
        seq: a string, a list of strings or token ids.
        role: one of ``NAMED`` (retriever, mixer, reset, content).
        heads: as in ``detect_head``: a list of (layer, head) or a dict
            layer -> heads; other heads are NaN. Default: every head.
        config: the GeometryConfig of the run.
        role_config: the RoleConfig.
        regime: deprecated: ``role``'s former name.
        taxonomy: deprecated: ``role_config``'s former name.

    Returns:
        The bootstrap probability of the role per head, ``[n_layers, n_heads]``.
    """
    role = renamed_keyword("detect_role", "regime", "role", regime, role, GeometryError)
    role_config = renamed_keyword("detect_role", "taxonomy", "role_config", taxonomy, role_config, GeometryError)
    if role not in NAMED:
        raise GeometryError(f"role: expected one of {NAMED}, got {role!r}")
    check_model(model)
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    if heads is None:
        pairs = [(layer, head) for layer in range(n_layers) for head in range(n_heads)]
    elif isinstance(heads, dict):
        pairs = [(int(layer), int(head)) for layer, hs in heads.items() for head in hs]
    elif isinstance(heads, list):
        pairs = [(int(layer), int(head)) for layer, head in heads]
    else:
        raise GeometryError(f"heads: expected a list of (layer, head), a dict layer -> heads or None, got {heads!r}")
    if not pairs:
        raise GeometryError("heads: got no heads; pass None for every head")
    overrides = {"layers": sorted({p[0] for p in pairs}), "heads": sorted({p[1] for p in pairs})}
    found = classify_heads(model, seq, with_roles(config).with_overrides(**overrides), role_config=role_config)
    scores = torch.full((n_layers, n_heads), math.nan)
    layer_at = torch.tensor([found.layers.index(layer) for layer, _ in pairs])
    head_at = torch.tensor([found.heads.index(head) for _, head in pairs])
    wanted = torch.tensor(pairs)
    scores[wanted[:, 0], wanted[:, 1]] = found.probabilities[layer_at, head_at, NAMED.index(role)].float()
    return scores

__getattr__ = old_names(__name__, globals())  # the names they had before (tl_geometry._renamed)
