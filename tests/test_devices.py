"""--device and --dtype: devices that are not there are refused before loading; the analysis stays float32."""

import pytest
import torch

from tests import tiny_models as tm
from tests.fixtures import forbid_loading
from tl_geometry.capture.hooks import run_with_geometry_hooks
from tl_geometry.engine import context
from tl_geometry.errors import GeometryError
from tl_geometry.models import check_device, load_model, model_dtype, transformer_lens_major_version

NO_CUDA = not torch.cuda.is_available()
NO_MPS = not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available())


@pytest.mark.parametrize(
    "device, message, missing",
    [
        ("cuda", r"device: 'cuda' asked for, but torch sees no CUDA device .*; use --device cpu", NO_CUDA),
        ("cuda:1", r"device: 'cuda:1' asked for, but torch sees", NO_CUDA or torch.cuda.device_count() < 2),
        ("mps", r"device: 'mps' asked for, but MPS is not available here; use --device cpu", NO_MPS),
        ("gpu0", r"device: 'gpu0' is not a torch device; use cpu, cuda, cuda:1 or mps", True),
        ("meta", r"device: 'meta' is not supported; use cpu, cuda, cuda:N or mps", True),
    ],
)
def test_devices_that_are_not_there(device, message, missing):
    if not missing:
        pytest.skip(f"this machine has {device}")
    with pytest.raises(GeometryError, match=message):
        check_device(device)


def test_a_missing_device_is_refused_before_anything_loads(monkeypatch):
    if not NO_CUDA:
        pytest.skip("this machine has CUDA")

    forbid_loading(monkeypatch, "load_model read the model before checking the device")
    with pytest.raises(GeometryError, match="device: 'cuda' asked for"):
        load_model(device="cuda")
    with pytest.raises(GeometryError, match=r"dtype: expected one of \('float32', 'bfloat16', 'float16'\), got 'int8'"):
        load_model(dtype="int8")


@pytest.mark.parametrize(
    "given, expected",
    [("float32", torch.float32), ("bfloat16", torch.bfloat16), ("float16", torch.float16), (torch.bfloat16, torch.bfloat16)],
)
def test_model_dtypes(given, expected):
    assert model_dtype(given) is expected


@pytest.mark.parametrize("bad", ["fp16", "float64", torch.float64, "half"])
def test_bad_model_dtypes(bad):
    with pytest.raises(GeometryError, match=r"dtype: expected one of \('float32', 'bfloat16', 'float16'\)"):
        model_dtype(bad)


@pytest.mark.model
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_models_are_analysed_in_float32(monkeypatch, dtype):
    seen = []
    original = context.SelectionContext.__init__

    def spy(self, *args, **kwargs):
        original(self, *args, **kwargs)
        seen.append((self.dtype, self.pattern.dtype))

    monkeypatch.setattr(context.SelectionContext, "__init__", spy)
    texts = ["the cat sat on the mat and ran", "a dog ran to the big red sun"]
    half = run_with_geometry_hooks(tm.make_model("bridge-llama", dtype=dtype), texts, n_grid=[1, 2, 4])
    assert {working for working, _ in seen} == {torch.float32} and {given for _, given in seen} == {dtype}
    reference = run_with_geometry_hooks(tm.make_model("bridge-llama", dtype=torch.float32), texts, n_grid=[1, 2, 4])
    assert torch.equal(half.count("recall"), reference.count("recall"))
    # Rounding the weights to 8 (bf16) or 11 (fp16) mantissa bits moves attention by about 1 %, which
    # can swap near-tied keys; the means over 8 heads x 2 documents stay close.
    assert (half.per_head("recall") - reference.per_head("recall")).abs().mean() < 0.1


@pytest.mark.slow
@pytest.mark.model
def test_load_model_in_bfloat16(smollm2, capsys):
    if transformer_lens_major_version() < 4:
        with pytest.raises(GeometryError, match=r"dtype='bfloat16' with a TransformerBridge needs transformer-lens 4.x"):
            load_model(dtype="bfloat16", progress=False)  # refused before anything loads
        return
    model = load_model(dtype="bfloat16", progress=False)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16} and model.cfg.dtype == torch.bfloat16
    assert capsys.readouterr().out == ""  # TransformerLens's own cast prints
    # Every tensor of the bridge and of the Hugging Face model it wraps (buffers included) is the float32
    # model's rounded to bfloat16.
    for part in ("", "original_model"):
        cast, full = ({**dict(m.get_submodule(part).state_dict()), **dict(m.get_submodule(part).named_buffers())}
                      for m in (model, smollm2))
        assert cast.keys() == full.keys() and len(cast) > 100
        for name, tensor in full.items():
            assert torch.equal(cast[name], tensor.to(torch.bfloat16)), f"{part}: {name}"
    result = run_with_geometry_hooks(model, "The quick brown fox jumps over the lazy dog.", n_grid=[1, 2, 4])
    assert result.stats["recall"].total.dtype == torch.float64
    assert bool(torch.isfinite(result.per_head("recall")).all())
