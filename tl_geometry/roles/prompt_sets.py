"""Prompt sets whose mechanism the field knows, and detectors written from their definitions, on a model.

To check the roles against heads whose mechanism is known, it builds three
prompt sets and scores every head with detectors written from their
definitions, on ``hook_pattern`` alone (independent of the role features):

- natural text (the default text): the previous-token score, the mean weight
  of a query on the key just before it; the duplicate-token score, the weight
  on earlier keys holding the query's own token (over queries that have one);
- repeated random tokens: BOS followed by T random tokens, then the same T
  again. The induction score is the mean weight of a second-copy query on the
  key after the previous occurrence of its token (lag T - 1);
- every prompt: the BOS score, the mean weight on the first real token.

Scores average over queries at positions >= 2 (the first rows see too few
keys to say anything) and over prompts, ``[layer, head]``.
"""

import math
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor
from tqdm.auto import tqdm

from tl_geometry._renamed import renamed_keyword
from tl_geometry.analysis.detector_agreement import DETECTORS, PromptSetCheck
from tl_geometry.analysis.head_roles import RoleConfig, roles_from_result
from tl_geometry.capture.hook_names import pattern_hook
from tl_geometry.capture.hooks import run_with_geometry_hooks
from tl_geometry.capture.tokens import HookableModel, check_model, input_device
from tl_geometry.config import GeometryConfig
from tl_geometry.corpus_input.plain_text import default_text
from tl_geometry.corpus_input.token_windows import text_windows
from tl_geometry.errors import GeometryError
from tl_geometry.roles.classify import with_roles


def repeated_random_tokens(model: HookableModel, n_prompts: int = 8, period: int = 64, seed: int = 0) -> Int[Tensor, "prompt pos"]:
    """BOS, then ``period`` random tokens, then the same ``period`` tokens again (induction prompts).

    The tokens are drawn uniformly from the vocabulary's ordinary ids (the
    tokenizer's special ids left out), with a generator seeded by ``seed``.
    """
    check_model(model)
    if n_prompts < 1 or period < 2:
        raise GeometryError(f"n_prompts, period: expected n_prompts >= 1 and period >= 2, got {n_prompts}, {period}")
    tokenizer = model.tokenizer
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    vocab = int(model.cfg.d_vocab)
    ordinary = torch.tensor([i for i in range(vocab) if i not in special])
    generator = torch.Generator().manual_seed(seed)
    random = ordinary[torch.randint(len(ordinary), (n_prompts, period), generator=generator)]
    bos = torch.full((n_prompts, 1), int(tokenizer.bos_token_id if tokenizer.bos_token_id is not None else random[0, 0]))
    return torch.cat([bos, random, random], dim=1)


def natural_text(model: HookableModel, n_prompts: int = 8, context: int = 256) -> Int[Tensor, "prompt pos"]:
    """``n_prompts`` consecutive windows of the default text, BOS first."""
    return text_windows(model, default_text(), context=context, n_windows=n_prompts)


def detector_scores(model: HookableModel, tokens: Int[Tensor, "prompt pos"], period: int | None = None) -> dict[str, Tensor]:
    """The detectors of the module docstring for every head, from ``hook_pattern``; ``{name: [layer, head]}``.

    Args:
        model: a TransformerLens model (left as it was).
        tokens: unpadded prompts ``[prompt, pos]``, BOS first.
        period: for repeated prompts (`repeated_random_tokens`), T; then the
            induction score is computed (NaN otherwise).
    """
    check_model(model)
    hooks, out = _detector_hooks(model, tokens, period)
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        model(tokens.to(next(model.parameters()).device), return_type=None)
    return out


def _detector_hooks(
    model: HookableModel, tokens: Int[Tensor, "prompt pos"], period: int | None
) -> tuple[list[tuple[str, Any]], dict[str, Tensor]]:
    """Hooks on every layer's ``hook_pattern`` that fill the detector scores of `detector_scores`, and those scores
    (NaN until a pass over ``tokens`` has run with the hooks on)."""
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    device = input_device(model)
    tokens = tokens.to(device)
    pos = tokens.shape[1]
    q = torch.arange(pos, device=device)
    counted = q >= 2
    same = (tokens.unsqueeze(2) == tokens.unsqueeze(1)) & (q.view(1, 1, -1) < q.view(1, -1, 1))  # [prompt, q, k]
    has_duplicate = same.any(-1) & counted
    out = {name: torch.full((n_layers, n_heads), math.nan, dtype=torch.float64) for name in DETECTORS}

    def reduce(pattern: Tensor, layer: int) -> None:
        p = pattern.detach().double()  # [prompt, head, q, k]
        out["bos"][layer] = p[:, :, counted, 0].mean((0, 2)).cpu()
        previous = p[:, :, q[2:], q[2:] - 1]
        out["previous_token"][layer] = previous.mean((0, 2)).cpu()
        on_duplicates = (p * same.unsqueeze(1)).sum(-1)  # [prompt, head, q]
        weights = has_duplicate.unsqueeze(1).double()
        out["duplicate_token"][layer] = ((on_duplicates * weights).sum((0, 2)) / weights.sum((0, 2))).cpu()
        if period is not None:
            second = q[period + 1 :]
            out["induction"][layer] = p[:, :, second, second - period + 1].mean((0, 2)).cpu()

    return [(pattern_hook(layer), lambda t, hook, layer=layer: reduce(t, layer)) for layer in range(n_layers)], out


def check_known_mechanisms(
    model: HookableModel,
    *,
    n_prompts: int = 4,
    context: int = 256,
    period: int = 64,
    config: GeometryConfig | None = None,
    role_config: RoleConfig | None = None,
    seed: int = 0,
    progress: bool = False,
    taxonomy: RoleConfig | None = None,
) -> dict[str, PromptSetCheck]:
    """Detector scores and roles on natural text and on repeated random tokens.

    On natural text the roles come from the default query sample; on the
    repeated prompts from every query of the second copy (where induction
    can act), ``settings={"roles": {"queries": "analysed"}}``. Prompts are
    cut to the model's context (``cfg.n_ctx``) where it is shorter.
    One forward pass per set computes both the detector scores and the roles
    (the pattern path: the detectors read the whole attention pattern), so
    the cost is two passes, over ``n_prompts`` x ``context`` and
    ``n_prompts`` x (2 ``period`` + 1) tokens, with the role features of
    their rows; it grows linearly with ``n_prompts``
    (`benchmarks/bench_main_job.py` measures it beside a bare pass).
    ``progress`` shows a bar over the two sets. ``role_config``: the rules' thresholds (``taxonomy``, its former
    name, is deprecated).

    Returns:
        ``{"natural": PromptSetCheck, "repeated": PromptSetCheck}``.
    """
    role_config = renamed_keyword("check_known_mechanisms", "taxonomy", "role_config", taxonomy, role_config,
                                  GeometryError)
    base = with_roles(config)
    n_ctx = getattr(model.cfg, "n_ctx", None)
    if n_ctx:  # a model with a short context gets prompts that fit it
        context, period = min(context, int(n_ctx)), min(period, (int(n_ctx) - 1) // 2)
    natural = natural_text(model, n_prompts, context)
    repeated = repeated_random_tokens(model, n_prompts, period, seed)
    second_copy = list(range(period + 1, 2 * period + 1))
    on_repeated = base.with_overrides(
        query_positions=second_copy, settings={**dict(base.settings), "roles": {"queries": "analysed"}}
    )
    out = {}
    sets = (("natural", natural, base, None), ("repeated", repeated, on_repeated, period))
    with tqdm(total=len(sets), desc="tl_geometry: known-mechanism check", unit="set", disable=not progress) as bar:
        for name, tokens, run_config, t in sets:
            bar.set_postfix_str(f"{name}, {tokens.shape[0]} x {tokens.shape[1]} tokens", refresh=False)
            # One pass per set: the detectors read the whole pattern the role features are measured on (the
            # pattern path); a pass of their own cost about a bare forward pass (measured on a loaded machine).
            hooks, scores = _detector_hooks(model, tokens, t)
            with model.hooks(fwd_hooks=hooks):
                result = run_with_geometry_hooks(model, tokens, config=run_config.with_overrides(capture="pattern"))
            out[name] = PromptSetCheck(name, scores, roles_from_result(result, role_config), t, int(tokens.shape[0]))
            bar.update()
    return out
