"""analyze_corpus: the geometry hooks over a corpus, one batch of activations at a time.

Two kinds of input: texts and token tensors (tokenised up front, as before),
and streams of `Window` (from `tl_geometry.capture.sources`), drawn lazily a
batch at a time so that neither the corpus nor its tokens are held whole.
"""

import itertools
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from tqdm.auto import tqdm
from torch import Tensor

from tl_geometry.config import GeometryConfig, make_config
from tl_geometry.errors import GeometryError
from tl_geometry.capture.hooks import analyse_prepared, grid_for, model_name, new_accumulator
from tl_geometry.capture.sources import Window, WindowStream
from tl_geometry.capture.tokens import HookableModel, PreparedTokens, prepare_tokens
from tl_geometry.results.provenance import model_provenance, package_versions
from tl_geometry.results.result import GeometryResult

DEFAULT_BATCH_SIZE = 8


def _batches(model: HookableModel, corpus: Any, config: GeometryConfig, batch_size: int) -> list[PreparedTokens]:
    """Tokenised batches: texts and the rows of one token tensor are cut into ``batch_size`` rows;
    an iterable of token tensors is taken batch by batch as given. Token ids are cheap to hold;
    only activations are kept to one batch at a time."""
    if isinstance(corpus, str):
        corpus = [corpus]
    if isinstance(corpus, Tensor):
        return [prepare_tokens(model, rows, config) for rows in corpus.split(batch_size)]
    if not isinstance(corpus, Iterable):
        raise GeometryError(
            f"texts_or_token_batches: expected a list of strings, a [sequence, pos] token tensor or an "
            f"iterable of [batch, pos] token tensors, got {type(corpus).__name__}"
        )
    items = list(corpus)
    if not items:
        raise GeometryError("texts_or_token_batches: the corpus is empty; pass at least one text or batch")
    if all(isinstance(item, str) for item in items):
        return [prepare_tokens(model, items[i : i + batch_size], config) for i in range(0, len(items), batch_size)]
    if all(isinstance(item, Tensor) for item in items):
        return [prepare_tokens(model, item, config) for item in items]
    kinds = sorted({type(item).__name__ for item in items})
    raise GeometryError(
        f"texts_or_token_batches: mixes or holds unsupported items {kinds}; pass only strings or only token tensors"
    )


def analyze_corpus(
    model: HookableModel,
    texts_or_token_batches: Any,
    config: GeometryConfig | None = None,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = True,
    **overrides: Any,
) -> GeometryResult:
    """Selection metrics over a corpus, batch after batch, equal to analysing it all at once.

    The N grid is fixed once for the whole corpus (from the longest query),
    so every batch reports the same N. Each sequence is one document; the
    result keeps exact statistics over documents (memory flat in their
    number), so batching never changes it.

    Args:
        model: a TransformerLens model (see `tl_geometry.run_with_geometry_hooks`).
        texts_or_token_batches: a list of strings (one sequence each), a
            ``[sequence, pos]`` token tensor, an iterable of ``[batch, pos]``
            token tensors (each run as one batch), or windows: a
            `WindowStream` (`tl_geometry.read_corpus`,
            `tl_geometry.window_documents`) or any iterable of `Window`,
            read lazily ``batch_size`` windows at a time.
        config: the GeometryConfig (default ``GeometryConfig()``).
        batch_size: sequences per forward pass for texts and a single tensor.
        progress: show a tqdm progress bar (windows, tokens per second and
            time left for windows) and, at the end, what was skipped.
        **overrides: config fields to replace.

    Returns:
        GeometryResult over every sequence, with its ``provenance`` (the
        model, package versions and, for windows, the corpus report).

    The N grid of a window stream is fixed from its ``context`` (every
    window's length at most), that of another iterable of windows from its
    first batch.
    """
    config = make_config(config, overrides)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise GeometryError(f"batch_size: expected a positive integer, got {batch_size!r}")
    corpus = texts_or_token_batches
    if not isinstance(corpus, (str, Tensor, WindowStream)) and isinstance(corpus, Iterable):
        items = iter(corpus)
        head = list(itertools.islice(items, 1))
        corpus = itertools.chain(head, items)
        if head and isinstance(head[0], Window):
            return _analyse_windows(model, corpus, None, config, batch_size, progress)
    if isinstance(corpus, WindowStream):
        return _analyse_windows(model, iter(corpus), corpus, config, batch_size, progress)
    batches = _batches(model, corpus, config, batch_size)
    accumulator = new_accumulator(model, config, grid_for(model, batches, config))
    for batch in tqdm(batches, desc="tl_geometry: analysing", unit="batch", disable=not progress):
        analyse_prepared(model, batch, config, accumulator)
    provenance = {"model": model_provenance(model), "versions": package_versions(),
                  "corpus": {"documents": accumulator.n_documents}}
    return GeometryResult.from_accumulator(accumulator, config=config, model_name=model_name(model),
                                           provenance=provenance)


def _window_batch(model: HookableModel, windows: list[Window], config: GeometryConfig) -> PreparedTokens:
    """Windows as one batch: stacked, or right-padded with an attention mask when their lengths differ."""
    lengths = [len(w.tokens) for w in windows]
    width = max(lengths)
    if min(lengths) == width:
        return prepare_tokens(model, torch.stack([w.tokens for w in windows]), config)
    pad = getattr(getattr(model, "tokenizer", None), "pad_token_id", None) or 0
    tokens = torch.full((len(windows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(windows), width), dtype=torch.long)
    for row, (window, length) in enumerate(zip(windows, lengths, strict=True)):
        tokens[row, :length] = window.tokens
        mask[row, :length] = 1
    return prepare_tokens(model, tokens, config, attention_mask=mask)


def _analyse_windows(
    model: HookableModel,
    windows: Iterator[Window],
    stream: WindowStream | None,
    config: GeometryConfig,
    batch_size: int,
    progress: bool,
) -> GeometryResult:
    """Draw ``batch_size`` windows at a time, analyse them, and let them go."""
    first = list(itertools.islice(windows, batch_size))
    if not first:
        found = f" ({stream.report.summary()})" if stream is not None else ""
        raise GeometryError(f"corpus: no windows to analyse{found}; pass more or longer documents, or a smaller "
                            "context")
    for item in first:
        if not isinstance(item, Window):
            raise GeometryError(f"corpus: expected only Window items, got a {type(item).__name__}")
    # Every window is at most the stream's context long, so that length fixes the grid for all of them.
    context = stream.context if stream is not None else max(len(w.tokens) for w in first)
    probe = prepare_tokens(model, torch.zeros((1, context), dtype=torch.long), config)
    accumulator = new_accumulator(model, config, grid_for(model, [probe], config))
    total = stream.n_windows if stream is not None else None
    bar = tqdm(total=total, desc="tl_geometry: analysing", unit="window", disable=not progress)
    start, tokens = time.perf_counter(), 0
    batch = first
    with bar:
        while batch:
            if not all(isinstance(item, Window) for item in batch):
                kinds = sorted({type(item).__name__ for item in batch})
                raise GeometryError(f"corpus: expected only Window items, got {kinds}")
            analyse_prepared(model, _window_batch(model, batch, config), config, accumulator)
            tokens += sum(len(w.tokens) for w in batch)
            bar.update(len(batch))
            bar.set_postfix_str(f"{tokens / max(time.perf_counter() - start, 1e-9):,.0f} tok/s", refresh=False)
            batch = list(itertools.islice(windows, batch_size))
    corpus: dict[str, Any] = {"windows": accumulator.n_documents}
    if stream is not None:
        corpus = {"context": stream.context, "n_windows": stream.n_windows, "min_context": stream.min_context,
                  "prepend_bos": stream.prepend_bos, **stream.report.to_json()}
        if progress and (stream.report.skipped or stream.report.tail_tokens):
            print(f"tl_geometry: {stream.report.summary()}", file=sys.stderr)
    provenance = {"model": model_provenance(model), "versions": package_versions(), "corpus": corpus}
    return GeometryResult.from_accumulator(accumulator, config=config, model_name=model_name(model),
                                           provenance=provenance)
