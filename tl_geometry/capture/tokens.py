"""Token ids in, and the queries to analyse: text is tokenised here, token tensors are checked.

Padding: sequences of different lengths are right-padded and the model gets
an ``attention_mask``; padded keys are never visible, and each sequence's
"last" query is its last real token. Token tensors may also be left-padded if
their ``attention_mask`` is passed.
"""

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from tl_geometry.capture.windows import visible_keys
from tl_geometry.config import GeometryConfig
from tl_geometry.errors import GeometryError

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

    def visible(self, window: int | None) -> Bool[Tensor, "batch query key"]:
        """Keys each analysed query can see in a layer with this sliding window (None: global).

        Causal, not padding, and inside the window (see `tl_geometry.capture.windows`).
        """
        return visible_keys(self.query_index, self.real[:, : self.n_keys], window)

    def sink(self, visible: Bool[Tensor, "batch query key"]) -> Int[Tensor, "batch query"]:
        """The sink of each query: the sequence's first real token where the query can see it, else -1."""
        first = self.real.int().argmax(-1)  # [batch]
        sees = visible.gather(2, first[:, None, None].expand(-1, visible.shape[1], 1)).squeeze(-1)
        return torch.where(sees, first[:, None], -1)

    def max_visible(self, windows: Sequence[int | None] = (None,)) -> int:
        """Most keys any analysed query sees in any of these layers (the default grid's last N)."""
        return max(int((self.visible(w) & self.query_valid.unsqueeze(-1)).sum(-1).max()) for w in set(windows))

    def documents(self) -> list[Int[Tensor, " pos"]]:
        """The real token ids of each sequence (no padding): what identifies a document."""
        return [row[mask] for row, mask in zip(self.tokens, self.real, strict=True)]


def input_device(model: Any) -> torch.device:
    """Where a model's input tokens go: ``cfg.device`` (under a device map, the embedding's device; the first
    parameter there may wait offloaded on the meta device), else the first parameter's device."""
    device = getattr(model.cfg, "device", None)
    return torch.device(device) if device is not None else next(model.parameters()).device


def accepts_attention_mask(model: HookableModel) -> bool:
    """Whether the model's forward takes an ``attention_mask`` (HookedTransformer 3.x's and the bridge's do)."""
    params = inspect.signature(model.forward).parameters.values()
    return any(p.name == "attention_mask" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def check_model(model: Any) -> None:
    """Raise GeometryError unless ``model`` is a TransformerLens model with the hooks this package reads."""
    if isinstance(model, HookableModel) and all(hasattr(model.cfg, a) for a in ("n_layers", "n_heads")):
        return
    kind = "None" if model is None else type(model).__name__
    hint = "load one with tl_geometry.load_model(name) or transformer_lens"
    if hasattr(model, "config") and hasattr(model, "generate"):  # a Hugging Face model
        hint = ("wrap it: TransformerBridge.boot_transformers(name, hf_model=model, tokenizer=tokenizer) "
                "(transformer_lens.model_bridge)")
    raise GeometryError(
        f"model: expected a TransformerLens model (HookedTransformer or TransformerBridge, with cfg, hook_dict "
        f"and hooks()), got {kind}; {hint}"
    )


def _check_length(model: HookableModel, length: int, what: str) -> None:
    """Refuse sequences longer than the model's context (TransformerLens would cut or fail silently)."""
    n_ctx = getattr(model.cfg, "n_ctx", None)
    if isinstance(n_ctx, int) and length > n_ctx:
        raise GeometryError(
            f"tokens: {what} {length} tokens long, more than the model's context n_ctx={n_ctx}; cut it into "
            f"windows with tl_geometry.text_windows(model, text, context={n_ctx}) or pass tokens[:, :{n_ctx}]"
        )


def _tokenize(model: HookableModel, texts: Sequence[str], prepend_bos: bool) -> tuple[Tensor, Tensor]:
    """Tokenise each text alone and right-pad: ``(tokens, real)``; empty texts are refused."""
    # Whitespace alone is refused too: it tokenises to a space token or two, with no text to select from.
    empty = [i for i, text in enumerate(texts) if isinstance(text, str) and not text.strip()]
    if empty:
        raise GeometryError(
            f"tokens: text(s) {empty[:10]} of {len(texts)} are empty strings or only whitespace (they would be "
            "analysed as a lone BOS token and spaces); drop them first, e.g. [t for t in texts if t.strip()]"
        )
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise GeometryError(
            "tokens: got text but the model has no tokenizer; pass token ids as a [batch, pos] integer "
            "tensor, or attach a tokenizer to the model"
        )
    if len(texts) == 0:
        raise GeometryError("tokens: got an empty list of texts; pass at least one string")
    rows = [model.to_tokens(text, prepend_bos=prepend_bos, truncate=False)[0].cpu() for text in texts]
    no_text = [i for i, row in enumerate(rows) if len(row) <= int(prepend_bos)]
    if no_text:
        raise GeometryError(
            f"tokens: text(s) {no_text[:10]} tokenised to no tokens of their own; drop them from the list"
        )
    for i, row in enumerate(rows):
        _check_length(model, len(row), f"text {i} is")
    width = max(len(row) for row in rows)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    tokens = torch.full((len(rows), width), pad_id, dtype=torch.long)
    real = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = row
        real[i, : len(row)] = True
    return tokens, real


def _check_token_tensor(model: HookableModel, tokens: Tensor, attention_mask: Tensor | None) -> Tensor:
    """Validate a token tensor (dtype, shape, ids in the vocabulary, length) and return its ``real`` mask."""
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise GeometryError(
            f"tokens: expected integer token ids, got dtype {tokens.dtype}; "
            "pass model.to_tokens(text) or a LongTensor (embeddings are not supported)"
        )
    if tokens.dtype not in (torch.int64, torch.int32):
        raise GeometryError(
            f"tokens: expected int64 (or int32) token ids, got dtype {tokens.dtype}, too narrow for a vocabulary "
            "(ids may have wrapped around); pass tokens.long() of the original ids"
        )
    if tokens.ndim != 2 or tokens.shape[1] == 0 or tokens.shape[0] == 0:
        raise GeometryError(
            f"tokens: expected shape [batch, pos] with batch, pos >= 1, got {list(tokens.shape)}; "
            "for one sequence use tokens.unsqueeze(0)"
        )
    vocab = getattr(model.cfg, "d_vocab", None)
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or (isinstance(vocab, int) and vocab > 0 and high >= vocab):
        bad = low if low < 0 else high
        raise GeometryError(
            f"tokens: id {bad} is outside the model's vocabulary 0..{vocab - 1 if isinstance(vocab, int) else '?'} "
            "(cfg.d_vocab); the ids come from another tokenizer, or padding used -1: pass model.to_tokens(text), "
            "and mark padding with attention_mask instead"
        )
    _check_length(model, tokens.shape[1], "the sequences are")
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
    """Check the model, tokenise if needed, find the real tokens and the query positions of every sequence."""
    check_model(model)
    if isinstance(tokens, str):
        tokens = [tokens]
    if isinstance(tokens, Tensor):
        real = _check_token_tensor(model, tokens, attention_mask)
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
        # Negative positions count from each sequence's end (-1: its last token).
        offsets = torch.where(positions < 0, lengths.unsqueeze(-1) + positions, positions.expand(len(lengths), -1))
        shortest = int(lengths.min())
        bad = (offsets < 0) | (offsets >= lengths.unsqueeze(-1))
        if bool(bad.any()):
            raise GeometryError(
                f"query_positions: {list(config.query_positions)} reach beyond the shortest sequence "
                f"({shortest} tokens); use positions in [-{shortest}, {shortest - 1}] or query_positions='last'"
            )
    valid = offsets < lengths.unsqueeze(-1)
    # Rows too short for a query point it at their last real token; they are masked out later.
    offsets = torch.minimum(offsets, (lengths - 1).unsqueeze(-1))
    return PreparedTokens(tokens=tokens, real=real, query_index=first.unsqueeze(-1) + offsets, query_valid=valid)
