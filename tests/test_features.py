"""Taxonomy features against a slow float64 reference written from the definitions."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import tiny_models as tm
from tl_geometry.activations import LayerActivations
from tl_geometry.diagnostics.taxonomy import CURVE_FEATURES, SCALAR_FEATURES, TAXONOMY_FEATURES, row_features, taxonomy_features
from tl_geometry.capture.hooks import run_with_geometry_hooks


def reference_row(alpha, values, visible, grid) -> dict[str, list[float] | float]:
    """One query row, one N at a time, straight from section 4.2's definitions."""
    alpha, values = alpha.double(), values.double()
    keys = [i for i in range(len(alpha)) if visible[i]]
    sink, last = keys[0], keys[-1]
    if len(keys) < 2:
        return {**{n: [math.nan] * len(grid) for n in CURVE_FEATURES}, **dict.fromkeys(SCALAR_FEATURES, math.nan)}
    order = sorted(keys, key=lambda i: (-float(alpha[i]), i))
    y = {i: alpha[i] * values[i] for i in keys}

    def cos(a, b):
        return float(a @ b) / (float(a.norm()) * float(b.norm()) + 1e-12)

    out = {name: [] for name in CURVE_FEATURES}
    for n in grid:
        if n > len(keys):
            for name in CURVE_FEATURES:
                out[name].append(math.nan)
            continue
        top = order[:n]
        s = sum((y[i] for i in top), torch.zeros(values.shape[-1], dtype=torch.float64))
        out["taxonomy_s_norm"].append(float(s.norm()))
        out["s_norm_without_sink"].append(float(sum((y[i] for i in top if i != sink), torch.zeros_like(s)).norm()))
        out["s_norm_without_last"].append(float(sum((y[i] for i in top if i != last), torch.zeros_like(s)).norm()))
        out["cos_s_sink"].append(cos(s, values[sink]))
        out["cos_s_last"].append(cos(s, values[last]))
    rest = sum((y[i] for i in keys if i not in (sink, last)), torch.zeros(values.shape[-1], dtype=torch.float64))
    out.update(
        contribution_sink=float(y[sink].norm()),
        contribution_last=float(y[last].norm()),
        contribution_rest=float(rest.norm()),
        taxonomy_attention_sink=float(alpha[sink]),
        taxonomy_attention_last=float(alpha[last]),
    )
    return out


def random_rows(seed, rows=5, keys=9, d=4, ties=False):
    gen = torch.Generator().manual_seed(seed)
    alpha = torch.rand(rows, keys, generator=gen, dtype=torch.float64)
    if ties:
        alpha = (alpha * 3).round() / 3
    values = torch.randn(rows, keys, d, generator=gen, dtype=torch.float64)
    lengths = torch.randint(1, keys + 1, (rows,), generator=gen)
    starts = torch.randint(0, keys, (rows,), generator=gen) % (keys - lengths + 1)
    span = torch.arange(keys)
    mask = (span >= starts[:, None]) & (span < (starts + lengths)[:, None])
    return alpha * mask, values, mask


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), ties=st.booleans())
def test_row_features_match_reference(seed, ties):
    alpha, values, mask = random_rows(seed, ties=ties)
    grid = torch.tensor([1, 2, 3, 5, 9, 12])
    fast = row_features(alpha, values, mask, grid)
    for r in range(len(alpha)):
        want = reference_row(alpha[r], values[r], mask[r].tolist(), grid.tolist())
        for name in CURVE_FEATURES + SCALAR_FEATURES:
            got = fast[name][r].double()
            torch.testing.assert_close(got, torch.tensor(want[name], dtype=torch.float64), equal_nan=True, msg=name)


def test_leave_one_out_norms_bound_s_norm_and_vanish_with_single_key_removed():
    # The row's top-1 key is the last token: s(1) without it is the zero vector.
    alpha = torch.tensor([[0.1, 0.2, 0.7]], dtype=torch.float64)
    values = torch.eye(3, dtype=torch.float64).unsqueeze(0)
    f = row_features(alpha, values, torch.ones(1, 3, dtype=torch.bool), torch.tensor([1, 2, 3, 4]))
    assert f["s_norm_without_last"][0, 0] == 0
    assert f["s_norm_without_sink"][0, 0] == pytest.approx(0.7)  # the sink is not in the top-1 set
    assert f["cos_s_last"][0, 0] == pytest.approx(1.0)
    assert math.isnan(f["cos_s_last"][0, 3])  # N = 4 > 3 visible keys


def activations(seed=0, batch=3, heads=2, queries=3, keys=7, d=4):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([keys, keys - 2, 3])[:batch]
    real = torch.arange(keys) < lengths[:, None]
    query_index = torch.stack([lengths - 1 - k for k in range(queries - 1, -1, -1)], dim=-1).clamp(min=0)
    query_valid = torch.tensor([[True, True, True], [True, True, True], [False, True, True]])[:batch, :queries]
    mask = (torch.arange(keys) <= query_index[..., None]) & real[:, None, :]
    mask = mask[:, None].expand(batch, heads, queries, keys)
    alpha = torch.rand(batch, heads, queries, keys, generator=gen, dtype=torch.float64) * mask
    values = torch.randn(batch, keys, heads, d, generator=gen, dtype=torch.float64) * real[:, :, None, None]
    grid = torch.tensor([1, 2, 4, 8])
    return LayerActivations(0, values, alpha, mask, query_index, query_valid, real, grid)


def test_taxonomy_features_average_valid_queries_and_pad_positions():
    seen = activations()
    out = taxonomy_features(seen)
    assert set(out) == set(TAXONOMY_FEATURES)
    batch, heads, queries, keys = seen.alpha.shape
    for b in range(batch):
        for h in range(heads):
            rows = [
                reference_row(seen.alpha[b, h, q], seen.values[b, :, h], seen.key_mask[b, h, q].tolist(), seen.grid.tolist())
                for q in range(queries)
                if seen.query_valid[b, q]
            ]
            for name in CURVE_FEATURES + SCALAR_FEATURES:
                want = torch.nanmean(torch.tensor([r[name] for r in rows], dtype=torch.float64), dim=0)
                torch.testing.assert_close(out[name][b, h], want, equal_nan=True, msg=name)
            q = max(q for q in range(queries) if seen.query_valid[b, q])
            vis = seen.key_mask[b, h, q]
            last = int(vis.nonzero().max())
            v = seen.values[b, :, h]
            contribution = [float(seen.alpha[b, h, q, i] * v[i].norm()) if vis[i] else math.nan for i in range(keys)]
            cos = [
                float(v[i] @ v[last]) / (float(v[i].norm() * v[last].norm()) + 1e-12) if vis[i] else math.nan
                for i in range(keys)
            ]
            torch.testing.assert_close(out["contribution_by_position"][b, h], torch.tensor(contribution, dtype=torch.float64), equal_nan=True)
            torch.testing.assert_close(out["cos_last_by_position"][b, h], torch.tensor(cos, dtype=torch.float64), equal_nan=True)
    assert out["cos_s_last"].shape == (batch, heads, len(seen.grid))
    assert out["contribution_sink"].shape == (batch, heads)
    assert out["contribution_by_position"].shape == (batch, heads, keys)


@pytest.mark.model
def test_features_through_the_hooks_do_not_depend_on_batching():
    model = tm.make_model("bridge-llama")
    texts = ["the cat sat on the mat and ran", "a dog", "one two three four five six seven"]
    together = run_with_geometry_hooks(model, texts, diagnostics=["taxonomy"], n_grid=[1, 2, 4, 8])
    for i, text in enumerate(texts):
        alone = run_with_geometry_hooks(model, [text], diagnostics=["taxonomy"], n_grid=[1, 2, 4, 8])
        for name in CURVE_FEATURES + SCALAR_FEATURES:
            torch.testing.assert_close(together.per_sequence[name][i], alone.per_sequence[name][0], equal_nan=True, msg=name)
        width = alone.per_sequence["contribution_by_position"].shape[-1]
        for name in ("contribution_by_position", "cos_last_by_position"):
            padded = together.per_sequence[name][i]
            torch.testing.assert_close(padded[..., :width], alone.per_sequence[name][0], equal_nan=True, msg=name)
            assert padded[..., width:].isnan().all()
