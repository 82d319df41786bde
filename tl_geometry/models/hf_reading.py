"""Reading weights with transformers: a GGUF file dequantised to float32 (through a faster gguf reader), an
exported folder loaded, and transformers' progress bars and dtype keyword across its versions.
"""

import contextlib
import functools
import importlib.metadata
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch


def load_export(export_dir: Path, **placement: Any) -> tuple[Any, Any]:
    """Float32 Hugging Face model and tokenizer from an exported directory (``placement``: more keywords of
    ``from_pretrained``, such as a device map)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with hf_progress_bars(False):
        hf_model = AutoModelForCausalLM.from_pretrained(export_dir, **{**_float32_kwarg(), **placement})
        # Prepending BOS as TransformerLens wants, so that it keeps this tokenizer instead of reading it
        # again (Gemma-3's takes 3.4 s to read).
        tokenizer = AutoTokenizer.from_pretrained(export_dir, add_bos_token=True)
    return hf_model, tokenizer


def _float32_kwarg() -> dict[str, torch.dtype]:
    """The dtype keyword of ``from_pretrained`` for float32."""
    return dtype_kwarg(torch.float32)


def dtype_kwarg(dtype: torch.dtype) -> dict[str, torch.dtype]:
    """The dtype keyword of ``from_pretrained``: ``dtype`` since transformers 4.56."""
    version = importlib.metadata.version("transformers").split(".")
    major, minor = int(version[0]), int(version[1])
    key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    return {key: dtype}


@contextlib.contextmanager
def hf_progress_bars(enabled: bool) -> Iterator[None]:
    """Turn transformers' own progress bars on or off, restoring the previous setting."""
    import functools

    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    # The GGUF dequantisation bar is a plain tqdm that ignores transformers' switch.
    gguf_tqdm = getattr(gguf_utils, "tqdm", None)
    if enabled:
        hf_logging.enable_progress_bar()
    else:
        hf_logging.disable_progress_bar()
        if gguf_tqdm is not None:
            gguf_utils.tqdm = functools.partial(gguf_tqdm, disable=True)
    try:
        yield
    finally:
        if gguf_tqdm is not None:
            gguf_utils.tqdm = gguf_tqdm
        if was_enabled:
            hf_logging.enable_progress_bar()
        else:
            hf_logging.disable_progress_bar()


def dequantise_gguf(gguf_path: Path, steps: Any) -> tuple[Any, Any]:
    """Float32 Hugging Face model and tokenizer read from a GGUF file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with gguf_read_once():
        steps.set_postfix_str("tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        steps.update()
        steps.set_postfix_str("dequantising weights")
        hf_model = AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, gguf_file=gguf_path.name, **_float32_kwarg()
        )
        steps.update()
    # transformers 5 marks GGUF-loaded models as quantised and refuses to save them,
    # although the weights are already plain float32 tensors.
    if getattr(hf_model, "hf_quantizer", None) is not None:
        hf_model.hf_quantizer = None
    if hasattr(hf_model.config, "quantization_config"):
        del hf_model.config.quantization_config
    return hf_model, tokenizer


@contextlib.contextmanager
def gguf_read_once() -> Iterator[None]:
    """Within the block, each GGUF file is parsed once and gguf's tensor-name map built once per architecture.

    transformers parses the file three times in an export (tokenizer, config, weights) and rebuilds the
    name map for every tensor; each parse walks the whole vocabulary. Both results are read-only.
    """
    try:
        import gguf
        import numpy as np
    except ImportError:  # transformers says what to install
        yield
        return
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}

    class PlainViews(reader):  # type: ignore[misc, valid-type]
        """Slices plain ndarray views of the same map: numpy's memmap subclass costs Python calls per slice,
        and the reader slices the file several times per vocabulary entry."""

        @property
        def data(self) -> Any:
            return self.__dict__["data"]

        @data.setter
        def data(self, mapped: Any) -> None:
            self.__dict__["data"] = mapped.view(np.ndarray)

    def read_once(path: str | os.PathLike, mode: str = "r") -> Any:
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = PlainViews(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = read_once, functools.cache(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map
