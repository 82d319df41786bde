"""The device check's logic on the CPU: its tolerances, mismatch detection and exit code, the no-CUDA line, the table.

`tl_geometry.runs.device_check` (run by ``scripts/gpu_check.py``) compares runs on a device with the CPU
float64 reference. Here the results compared are built from known per-document values (an `Accumulator`), so
each test knows the per-head means it compares; and the whole check runs on a tiny Llama bridge standing in for
the bundled model, the CPU playing the device, once as it is and once with a mutant whose attention is changed.
"""

import math
import re

import pytest
import torch

from tests import tiny_models as tm
from tl_geometry.runs import device_check
from tl_geometry.runs.device_check import (
    BARE,
    TOLERANCES,
    Mismatch,
    Timing,
    Tolerance,
    compare_results,
    no_cuda_line,
    timing_table,
)
from tl_geometry.config import GeometryConfig
from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.errors import GeometryError
from tl_geometry.results.accumulators import Accumulator
from tl_geometry.results.result import GeometryResult

GRID = torch.tensor([1, 2, 4, 8])


def result_of(values: torch.Tensor, name: str = "recall") -> GeometryResult:
    """A result whose field ``name`` has these per-document values ``[doc, layer, head_index, n]``."""
    acc = Accumulator([FieldSpec(name, "a field", axes=("n",))], layers=(0, 3), heads=(0, 1, 2), n_grid=GRID)
    acc.add({name: values}, torch.zeros(values.shape[0], 0), n_tokens=16 * values.shape[0])
    return GeometryResult.from_accumulator(acc, config=GeometryConfig(), model_name="toy")


def documents(seed: int = 0) -> torch.Tensor:
    return torch.rand((3, 2, 3, len(GRID)), generator=torch.Generator().manual_seed(seed), dtype=torch.float64) + 0.1


def mismatches(got: torch.Tensor, want: torch.Tensor, dtype: str = "float32") -> list[Mismatch]:
    return compare_results(result_of(got), result_of(want), TOLERANCES[dtype], run="a run", dtype=dtype)


def test_every_dtype_checked_has_a_stated_tolerance():
    for dtype in device_check.DTYPES:
        tolerance = TOLERANCES[dtype]
        assert tolerance.why and tolerance.rtol > 0 and tolerance.atol > 0
        assert 0 <= tolerance.outliers < 1
    assert TOLERANCES["float32"].rtol < TOLERANCES["bfloat16"].rtol
    assert TOLERANCES["float32"].outliers == 0  # float32 has no near-ties to forgive at these sizes


@pytest.mark.parametrize("dtype", device_check.DTYPES)
def test_means_within_the_tolerance_pass_and_beyond_it_fail(dtype):
    t = TOLERANCES[dtype]
    want = documents()
    # Every document moved by the same amount moves the per-head mean by it (the mean is linear).
    assert mismatches(want + 0.9 * (t.atol + t.rtol * 0.1), want, dtype) == []  # values >= 0.1: within
    moved = want.clone()
    moved[:, 1, 2, 3] += 1.1 * (t.atol + t.rtol * want[:, 1, 2, 3].mean()) + t.gross * 2  # one entry, grossly
    found = mismatches(moved, want, dtype)
    assert [(m.field, m.run, m.dtype) for m in found] == [("recall", "a run", dtype)]
    assert "1 of 24 means off" in found[0].detail


def test_a_float32_entry_just_beyond_its_tolerance_fails():
    t = TOLERANCES["float32"]
    want = documents()
    mean = want[:, 0, 0, 0].mean()
    for factor, fails in ((0.9, False), (1.1, True)):
        moved = want.clone()
        moved[:, 0, 0, 0] += factor * (t.atol + t.rtol * mean)
        assert bool(mismatches(moved, want)) is fails, factor


def test_bfloat16_forgives_a_few_flipped_near_ties_but_not_many_nor_gross_ones():
    t = TOLERANCES["bfloat16"]
    want = documents()
    entries = want[0].numel()
    few = math.floor(t.outliers * entries)
    assert few >= 1
    flat = want.clone().flatten(1)
    flat[:, :few] += 0.3  # a near-tie flipped moves a mean by a fraction of the scale: forgiven
    assert mismatches(flat.view_as(want), want, "bfloat16") == []
    flat[:, : few + 1] += 0.3  # one entry more than the share allowed
    assert "may be" in mismatches(flat.view_as(want), want, "bfloat16")[0].detail
    gross = want.clone()
    gross[:, 0, 0, 0] += 2.0  # beyond half the field's scale (max(|max want|, 1) = 1.1 at most)
    assert "scale" in mismatches(gross, want, "bfloat16")[0].detail


def test_missing_entries_and_counts_must_match_exactly():
    want = documents()
    holed = want.clone()
    holed[:, 0, 1, 2] = float("nan")  # the field undefined in every document: a NaN mean, and counts of 0
    details = [m.detail for m in mismatches(holed, want)]
    assert any("defined counts differ at 1 of 24 entries" in d for d in details)
    assert any("1 of 24 means off (1 missing or infinite on one side only)" in d for d in details)
    infinite = want.clone()
    infinite[:, 0, 0, 0] = float("inf")
    assert any("infinite" in m.detail for m in mismatches(want, infinite))


def test_ties_against_a_bound_are_forgiven_in_a_few_entries_only():
    want = documents()
    name = sorted(device_check.TIE_FIELDS)[0]
    flipped = want.clone()
    flipped[0, 0, 0, 0] += 1.0  # one document's row flipped from below the bound to above it: 1 of 24 entries
    assert math.floor(device_check.TIE_SHARE * 24) >= 1
    tie = compare_results(result_of(flipped, name), result_of(want, name), TOLERANCES["float32"], run="r",
                          dtype="float32")
    assert tie == [] and mismatches(flipped, want)  # the same flip in an ordinary field is a mismatch
    flipped.flatten(1)[:, :12] += 1.0  # half the entries: not ties any more
    assert compare_results(result_of(flipped, name), result_of(want, name), TOLERANCES["float32"], run="r",
                           dtype="float32")


def test_other_fields_or_documents_are_mismatches():
    want = result_of(documents())
    other = result_of(documents(), name="precision")
    found = compare_results(other, want, TOLERANCES["float32"], run="r", dtype="float32")
    assert "missing ['recall'], unexpected ['precision']" in found[0].detail
    fewer = result_of(documents()[:2])
    found = compare_results(fewer, want, TOLERANCES["float32"], run="r", dtype="float32")
    assert found[0].field == "documents" and "2 documents" in found[0].detail


def test_the_table_divides_by_the_bare_forward_of_each_dtype():
    timings = [Timing(BARE, "float32", 2.0), Timing("pattern path", "float32", 5.0),
               Timing(BARE, "bfloat16", 4.0), Timing("pattern path", "bfloat16", float("nan")),
               Timing("torchrun", "float32", 9.0)]  # fmt: skip
    lines = timing_table(timings).splitlines()
    assert lines[0].split() == ["run", "float32", "bfloat16"]
    rows = {line[: len("pattern path")].strip(): line for line in lines[1:]}
    ratios = [float(x) for x in re.findall(r"\(\s*([\d.]+)x\)", rows["pattern path"])]
    assert ratios == [5.0 / 2.0]
    assert "failed" in rows["pattern path"]
    assert rows["torchrun"].rstrip().endswith("-")  # not run in bfloat16
    with pytest.raises(GeometryError, match="no 'bare forward .*' timing for bfloat16"):
        timing_table([Timing(BARE, "float32", 1.0), Timing("x", "bfloat16", 1.0)])


def tiny_loader(mutate: bool = False):
    """`load_model`'s stand-in: a tiny Llama bridge in the dtype asked (the float64 reference casts float32);
    with ``mutate``, the device's models (not the reference's) scale layer 1's query weights by 1.5."""

    def load(name, *, device="cpu", dtype="float32", progress=False):
        model = tm.tiny_bridge("llama", dtype={"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype])
        if mutate and not load.reference_loaded:
            load.reference_loaded = True  # the first load is the reference's
        elif mutate:
            with torch.no_grad():
                model.original_model.model.layers[1].self_attn.q_proj.weight.mul_(1.5)
        return model.to(device)

    load.reference_loaded = False
    return load


ARGS = ["--device", "cpu", "--no-torchrun", "--windows", "3", "--context", "24", "--layers", "0", "1",
        "--heads", "0", "1", "2", "3", "--repeats", "1"]  # fmt: skip


@pytest.mark.model
def test_the_check_passes_a_faithful_device_and_fails_a_mutant(capsys):
    assert device_check.main(ARGS, load=tiny_loader()) == 0
    out = capsys.readouterr().out
    assert "MISMATCH" not in out and "every field within tolerance" in out
    assert BARE in out and "all diagnostics, pattern path" in out
    assert device_check.main(ARGS, load=tiny_loader(mutate=True)) == 1
    out = capsys.readouterr().out
    assert re.search(r"MISMATCH default analysis \(rows path\), float32, \w+", out)
    assert "MISMATCHES" in out.splitlines()[-1]


@pytest.mark.model
def test_without_cuda_it_says_so_in_one_line_and_runs_the_cpu_half(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_check.main(ARGS[2:], load=tiny_loader()) == 0  # no --device: the check picks
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == no_cuda_line() and "CPU half" in lines[0]
    assert sum("no CUDA" in line for line in lines) == 1
    assert "wall times on cpu" in "\n".join(lines)
