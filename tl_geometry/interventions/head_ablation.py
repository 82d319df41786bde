"""Head ablations on a model: each role class and sub-type against random head sets of the same shape.

A head is ablated through its output before W_O, ``blocks.{l}.attn.hook_z``
``[batch, pos, head_index, d_head]`` (on a TransformerBridge the alias of
``blocks.{l}.attn.o.hook_in``; checked on transformer-lens 3.9 and 4.3): its
slice is replaced, at every position,

- ``"zero"``: by zeros, which is exactly zeroing the head's rows of W_O
  (the output bias stays);
- ``"mean"``: by the head's mean z over every position of natural-text
  windows that are not the evaluated ones (the windows after them in the
  text, or ``mean_tokens``).

Two losses, per document (window or prompt), clean and ablated:

- ``"natural"``: the mean next-token NLL over the window;
- ``"repeated"``: BOS, T random tokens, the same T again; the mean NLL of the
  second copy's tokens after its first (which nothing in the prompt
  predicts), the loss induction heads lower. Measured for previous-token and
  induction groups.

Each group is compared with ``n_random`` random head sets of its size and
layer distribution (`tl_geometry.analysis.role_ablation.random_head_sets`); the
table (`tl_geometry.analysis.role_ablation.RoleAblation`) gives the group's
change in loss with a document bootstrap interval, and the random band.
The model is left as it was: hooks live only inside ``model.hooks(...)``
and no weight is written, also when an error stops the run.
"""

import weakref
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from tl_geometry._renamed import renamed_keyword
from tl_geometry.analysis.role_ablation import (
    ABLATIONS,
    AblationRow,
    Head,
    HeadGroup,
    RoleAblation,
    ablation_row,
    random_head_sets,
    role_groups,
)
from tl_geometry.capture.held_models import as_hookable
from tl_geometry.capture.hook_names import z_hook
from tl_geometry.capture.hooks import model_name
from tl_geometry.capture.tokens import check_model, input_device
from tl_geometry.corpus_input.plain_text import default_text
from tl_geometry.corpus_input.token_windows import text_windows
from tl_geometry.engine.context import working_dtype
from tl_geometry.errors import GeometryError
from tl_geometry.roles.prompt_sets import detector_scores, repeated_random_tokens


def check_z_hooks(model: Any, layers: Sequence[int]) -> None:
    """Raise unless every layer has ``blocks.{l}.attn.hook_z`` and editing it changes the logits.

    One short pass per layer not checked before on this model: the layer's z
    is zeroed and the logits must differ from the clean ones.
    """
    check_model(model)
    missing = [layer for layer in layers if z_hook(layer) not in model.hook_dict]
    if missing:
        raise GeometryError(
            f"model {model_name(model)}: no hook {z_hook(missing[0])} (layers {missing}); head ablation edits the "
            "per-head output before W_O there. Use a HookedTransformer or a TransformerBridge of transformer-lens "
            ">= 3.9, which have it"
        )
    checked = _Z_CHECKED.setdefault(model, set())
    unchecked = sorted(set(int(layer) for layer in layers) - checked)
    if not unchecked:
        return
    tokens = (torch.arange(4, device=input_device(model)) % int(model.cfg.d_vocab))[None]

    def zero(z: Tensor, *, hook: Any = None) -> Tensor:
        return torch.zeros_like(z)

    with torch.no_grad():
        clean = model(tokens)
        ignored = []
        for layer in unchecked:
            with model.hooks(fwd_hooks=[(z_hook(layer), zero)]):
                if torch.equal(model(tokens), clean):
                    ignored.append(layer)
    if ignored:
        raise GeometryError(
            f"model {model_name(model)}: zeroing {z_hook(ignored[0])} does not change the logits on layers {ignored}; "
            "the hook fires after the fact, so ablations would measure nothing. Load the model with "
            "load_model(..., compatibility_mode=True) or use a HookedTransformer"
        )
    checked.update(unchecked)


_Z_CHECKED: "weakref.WeakKeyDictionary[Any, set[int]]" = weakref.WeakKeyDictionary()


class HeadAblationHook:
    """A ``hook_z`` function replacing the chosen heads' z at every position by zeros or by their mean.

    Args:
        layer: the layer it is attached to (names errors).
        heads: head indices to ablate.
        means: for mean-ablation, the layer's mean z ``[head_index, d_head]`` (None: zero-ablation).
    """

    def __init__(self, layer: int, heads: Sequence[int], means: Tensor | None = None) -> None:
        self.layer, self.heads, self.means = int(layer), tuple(int(h) for h in heads), means

    def __call__(self, z: Float[Tensor, "batch pos head_index d_head"], *, hook: Any = None) -> Tensor:
        if z.ndim != 4 or max(self.heads) >= z.shape[2]:
            raise GeometryError(
                f"{z_hook(self.layer)}: expected [batch, pos, head_index, d_head] with heads {list(self.heads)}, "
                f"got {list(z.shape)}"
            )
        out = z.clone()
        index = torch.tensor(self.heads, device=z.device)
        if self.means is None:
            out[:, :, index] = 0.0
        else:
            out[:, :, index] = self.means[index].to(device=z.device, dtype=z.dtype)
        return out


def ablation_hooks(
    heads: Sequence[Head], ablation: str = "zero", means: Float[Tensor, "layer head_index d_head"] | None = None
) -> list[tuple[str, HeadAblationHook]]:
    """The ``fwd_hooks`` ablating ``heads`` (``(layer, head)`` pairs): one ``hook_z`` function per layer.

    Args:
        heads: the heads to ablate.
        ablation: ``"zero"`` or ``"mean"``.
        means: for ``"mean"``, every layer's mean z ``[layer, head_index, d_head]`` (`mean_z`).

    >>> with model.hooks(fwd_hooks=ablation_hooks([(3, 1), (3, 4)])):  # doctest: +SKIP
    ...     logits = model(tokens)
    """
    if ablation not in ABLATIONS:
        raise GeometryError(f"ablation: expected one of {ABLATIONS}, got {ablation!r}")
    if ablation == "mean" and means is None:
        raise GeometryError("means: mean-ablation needs each head's mean z; compute it with mean_z(model, tokens)")
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(int(layer), []).append(int(head))
    return [(z_hook(layer), HeadAblationHook(layer, hs, means[layer] if ablation == "mean" else None))
            for layer, hs in sorted(by_layer.items())]


def _batches(tokens: Tensor, batch_size: int) -> Iterator[Tensor]:
    for start in range(0, tokens.shape[0], batch_size):
        yield tokens[start : start + batch_size]


def mean_z(
    model: Any, tokens: Int[Tensor, "window pos"], *, batch_size: int = 4, progress: bool = False
) -> Float[Tensor, "layer head_index d_head"]:
    """Every head's mean z (its output before W_O) over all positions of ``tokens``."""
    check_model(model)
    n_layers = int(model.cfg.n_layers)
    device = input_device(model)
    sums: list[Tensor | None] = [None] * n_layers
    count = 0

    def keep(z: Tensor, *, hook: Any, layer: int) -> None:
        part = z.detach().to(working_dtype(z)).sum((0, 1))
        sums[layer] = part if sums[layer] is None else sums[layer] + part

    hooks = [(z_hook(layer), lambda z, hook, layer=layer: keep(z, hook=hook, layer=layer)) for layer in range(n_layers)]
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        for batch in tqdm(list(_batches(tokens, batch_size)), desc="tl_geometry: mean z", disable=not progress):
            model(batch.to(device), return_type=None)
            count += batch.numel()
    return torch.stack([s / count for s in sums])  # type: ignore[operator]


def document_losses(
    logits: Float[Tensor, "batch pos vocab"], tokens: Int[Tensor, "batch pos"], first_target: int = 1
) -> Float[Tensor, " batch"]:
    """Each sequence's mean next-token NLL (nats) over the targets at positions >= ``first_target``."""
    pred = logits[:, first_target - 1 : -1]
    pred = pred.to(working_dtype(pred))
    target = tokens[:, first_target:].to(pred.device)
    nll = torch.logsumexp(pred, dim=-1) - pred.gather(-1, target[..., None]).squeeze(-1)
    return nll.double().mean(-1)


def _losses(model: Any, tokens: Tensor, first_target: int, hooks: list, batch_size: int, bar: Any) -> Tensor:
    device = input_device(model)
    out = []
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        for batch in _batches(tokens, batch_size):
            batch = batch.to(device)
            out.append(document_losses(model(batch), batch, first_target))
            bar.update(1)
    return torch.cat(out)


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise GeometryError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return value


def _check_roles_fit(model: Any, roles: Any) -> None:
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    bad_layers = [layer for layer in roles.layers if not 0 <= int(layer) < n_layers]
    bad_heads = [head for head in roles.heads if not 0 <= int(head) < n_heads]
    if bad_layers or bad_heads:
        raise GeometryError(
            f"roles: layers {bad_layers} / heads {bad_heads} do not exist in model {model_name(model)} "
            f"({n_layers} layers x {n_heads} heads); classify the heads of this model (tg.classify_heads)"
        )


def _group_seed(seed: int, name: str) -> int:
    return (int(seed) * 1_000_003 + zlib.crc32(name.encode())) & 0x7FFFFFFF


def ablate_roles(
    model: Any,
    roles: Any = None,
    *,
    n_windows: int = 8,
    context: int = 256,
    mean_windows: int = 8,
    tokens: Int[Tensor, "window pos"] | None = None,
    mean_tokens: Int[Tensor, "mean_window mean_pos"] | None = None,
    ablations: Sequence[str] = ABLATIONS,
    n_random: int = 8,
    repeated_prompts: int = 8,
    period: int = 64,
    detectors: bool = True,
    detector_threshold: float = 0.3,
    subtypes: bool = True,
    min_heads: int = 1,
    uncertain: bool = True,
    n_bootstrap: int = 1000,
    seed: int = 0,
    batch_size: int = 4,
    progress: bool = True,
    tokenizer: Any = None,
    taxonomy: Any = None,
) -> RoleAblation:
    """Mean- and zero-ablate each role class and sub-type, against random head sets of the same shape.

    Args:
        model: a TransformerLens model (HookedTransformer or TransformerBridge), a ``transformers`` causal LM
            or an nnsight ``LanguageModel`` (wrapped once, `tl_geometry.capture.held_models`); left as it was.
        roles: its HeadRoles (``tg.classify_heads(result)``); groups come from its labels and sub-types.
        n_windows: the evaluated natural-text windows: the first ``n_windows`` windows of ``context`` tokens
            (BOS first) of the default text (``tg.default_text()``).
        context: tokens per evaluated window.
        mean_windows: windows for the mean z: the ``mean_windows`` windows after the evaluated ones.
        tokens: your own evaluated windows instead (then ``mean_tokens`` is required).
        mean_tokens: your own windows for the mean z (no row may also be in ``tokens``).
        ablations: ``"zero"`` and/or ``"mean"``.
        n_random: random head sets per group (seeded).
        repeated_prompts: repeated-random-token prompts (BOS + ``period`` tokens, twice); 0 leaves that task out.
        period: T, the random tokens of each copy.
        detectors: also ablate the heads the detectors of `tl_geometry.roles.prompt_sets` name: previous-token
            (score >= ``detector_threshold`` on the evaluated windows) and induction (on the repeated prompts).
        detector_threshold: the detector score a head needs to join a detector group.
        subtypes: also one group per sub-type (see `tl_geometry.analysis.role_ablation.role_groups`).
        min_heads: leave out sub-type and detector groups with fewer heads.
        uncertain: also ablate the heads labelled "uncertain" as a group.
        n_bootstrap: document bootstrap replicates of each interval.
        seed: the seed of the random sets, the repeated prompts and the bootstrap.
        batch_size: documents per forward pass.
        progress: a progress bar over the forward passes.
        tokenizer: for a ``transformers`` or nnsight model, its tokenizer (as in `tl_geometry.run_with_geometry_hooks`).
        taxonomy: deprecated: ``roles``'s former name.

    Returns:
        RoleAblation: ``.rows`` / ``.table()`` / ``.to_dataframe()`` / ``.to_markdown()``; draw it with
        `tl_geometry.report.ablation_figure.ablation_figure`.

    Raises:
        GeometryError: bad arguments, roles of another model, overlapping evaluated and mean windows, a
            model without ``hook_z``.
    """
    model = as_hookable(model, tokenizer, compatibility_mode=True)
    check_model(model)
    from tl_geometry.analysis.role_ablation import _check_roles

    roles = renamed_keyword("ablate_roles", "taxonomy", "roles", taxonomy, roles, GeometryError)
    _check_roles(roles)
    _check_roles_fit(model, roles)
    ablations = tuple(ablations)
    if not ablations or any(a not in ABLATIONS for a in ablations) or len(set(ablations)) != len(ablations):
        raise GeometryError(f"ablations: expected a non-empty selection of {ABLATIONS}, got {ablations!r}")
    for name, value, minimum in (("n_windows", n_windows, 1), ("context", context, 4), ("mean_windows", mean_windows, 1),
                                 ("n_random", n_random, 2), ("repeated_prompts", repeated_prompts, 0),
                                 ("period", period, 2), ("n_bootstrap", n_bootstrap, 0), ("batch_size", batch_size, 1)):
        _check_int(name, value, minimum)
    if not 0 < float(detector_threshold) <= 1:
        raise GeometryError(f"detector_threshold: expected a share in (0, 1], got {detector_threshold!r}")
    if tokens is None:
        both = text_windows(model, default_text(), context=context, n_windows=n_windows + mean_windows)
        tokens, default_means = both[:n_windows], both[n_windows:]
    else:
        default_means = None
    if not isinstance(tokens, Tensor) or tokens.ndim != 2 or tokens.is_floating_point():
        raise GeometryError(f"tokens: expected integer token ids [window, pos], got {type(tokens).__name__}")
    if mean_tokens is None:
        if default_means is None:
            raise GeometryError("mean_tokens: required with your own tokens (windows for the mean z, not evaluated)")
        mean_tokens = default_means
    if not isinstance(mean_tokens, Tensor) or mean_tokens.ndim != 2 or mean_tokens.is_floating_point():
        raise GeometryError(f"mean_tokens: expected integer token ids [window, pos], got {type(mean_tokens).__name__}")
    shared = mean_tokens.shape[1] == tokens.shape[1] and any(bool((mean_tokens == row).all(-1).any()) for row in tokens)
    if shared:
        raise GeometryError(
            "mean_tokens: a window is also in tokens; the mean z must come from windows that are not evaluated"
        )
    layers = sorted({int(layer) for layer in roles.layers})
    check_z_hooks(model, list(range(int(model.cfg.n_layers))))
    available = {layer: [int(h) for h in roles.heads] for layer in layers}
    groups = role_groups(roles, subtypes=subtypes, min_heads=min_heads, uncertain=uncertain)
    if repeated_prompts:
        n_ctx = getattr(model.cfg, "n_ctx", None)
        if n_ctx and 2 * period + 1 > int(n_ctx):
            raise GeometryError(f"period: 2 x {period} + 1 tokens exceed the model's context {n_ctx}; pass a smaller period")
        repeated = repeated_random_tokens(model, repeated_prompts, period, seed)
    else:
        repeated = None
    if detectors:
        analysed = {(layer, head) for layer in layers for head in roles.heads}
        natural_scores = detector_scores(model, tokens)
        found = [("previous-token", natural_scores["previous_token"])]
        if repeated is not None:
            found.append(("induction", detector_scores(model, repeated, period)["induction"]))
        for name, scores in found:
            heads = tuple(sorted((int(l), int(h)) for l, h in (scores >= detector_threshold).nonzero().tolist()
                                 if (int(l), int(h)) in analysed))
            if len(heads) >= min_heads:
                groups.append(HeadGroup(f"detector {name}", "detector", heads, ("natural", "repeated")))
    if not groups:
        raise GeometryError("roles: no group of heads to ablate (no labels, or every group below min_heads)")
    tasks = {"natural": (tokens, 1)}
    if repeated is not None:
        tasks["repeated"] = (repeated, period + 2)
    draws = {g.name: random_head_sets(g.heads, available, n_random, _group_seed(seed, g.name)) for g in groups}
    passes = {task: -(-t.shape[0] // batch_size) for task, (t, _) in tasks.items()}
    total = sum(passes.values()) + sum(
        passes[task] * len(ablations) * (1 + n_random) for g in groups for task in g.tasks if task in tasks)
    means = mean_z(model, mean_tokens, batch_size=batch_size) if "mean" in ablations else None
    rows: list[AblationRow] = []
    with tqdm(total=total, desc="tl_geometry: ablations", disable=not progress) as bar:
        clean = {task: _losses(model, t, first, [], batch_size, bar) for task, (t, first) in tasks.items()}
        for group in groups:
            for task in (t for t in group.tasks if t in tasks):
                task_tokens, first = tasks[task]
                for ablation in ablations:
                    ablated = _losses(model, task_tokens, first, ablation_hooks(group.heads, ablation, means), batch_size, bar)
                    random = torch.stack([_losses(model, task_tokens, first, ablation_hooks(heads, ablation, means),
                                                  batch_size, bar) for heads in draws[group.name]])
                    rows.append(ablation_row(group, task, ablation, clean[task], ablated, random,
                                             n_bootstrap=n_bootstrap, seed=_group_seed(seed, group.name + task + ablation)))
    settings = {"windows": int(tokens.shape[0]), "context": int(tokens.shape[1]), "mean_windows": int(mean_tokens.shape[0]),
                "repeated_prompts": repeated_prompts if repeated is not None else 0, "period": period,
                "n_random": n_random, "n_bootstrap": n_bootstrap, "seed": seed, "detector_threshold": detector_threshold}
    return RoleAblation(tuple(rows), tuple(groups), model_name(model), settings)
