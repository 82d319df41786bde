"""Taxonomy features against a slow float64 reference written from the definitions."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import tiny_models as tm
from tl_geometry.capture.hooks import run_with_geometry_hooks
from tl_geometry.diagnostics.role_features import CURVE_FEATURES, POSITION_FEATURES, SCALAR_FEATURES, ROLE_DIAGNOSTIC_FIELDS, row_features
from tl_geometry.diagnostics.role_features import DIAGNOSTIC as TAXONOMY
from tl_geometry.engine.context import SelectionContext
from tl_geometry.engine.metrics import selection_metrics

# ||s(N)|| (once the taxonomy's own curve, now the selection metric s_norm) and the taxonomy curves.
REFERENCE_CURVES = ("s_norm", *CURVE_FEATURES)


def reference_row(alpha, values, visible, grid, sink="first") -> dict[str, list[float] | float]:
    """One query row, one N at a time, straight from section 4.2's definitions; the sink is the first visible
    key, or ``sink`` (None: the row sees no sink, and every sink quantity is NaN)."""
    alpha, values = alpha.double(), values.double()
    keys = [i for i in range(len(alpha)) if visible[i]]
    sink, last = keys[0] if sink == "first" else sink, keys[-1]
    if len(keys) < 2:
        return {**{n: [math.nan] * len(grid) for n in REFERENCE_CURVES}, **dict.fromkeys(SCALAR_FEATURES, math.nan)}
    order = sorted(keys, key=lambda i: (-float(alpha[i]), i))
    y = {i: alpha[i] * values[i] for i in keys}

    def cos(a, b):
        return float(a @ b) / (float(a.norm()) * float(b.norm()) + 1e-12)

    out = {name: [] for name in REFERENCE_CURVES}
    for n in grid:
        if n > len(keys):
            for name in REFERENCE_CURVES:
                out[name].append(math.nan)
            continue
        top = order[:n]
        s = sum((y[i] for i in top), torch.zeros(values.shape[-1], dtype=torch.float64))
        out["s_norm"].append(float(s.norm()))
        no_sink = sink is None
        out["s_norm_without_sink"].append(
            math.nan if no_sink else float(sum((y[i] for i in top if i != sink), torch.zeros_like(s)).norm()))
        out["s_norm_without_last"].append(float(sum((y[i] for i in top if i != last), torch.zeros_like(s)).norm()))
        out["cos_s_sink"].append(math.nan if no_sink else cos(s, values[sink]))
        out["cos_s_last"].append(cos(s, values[last]))
        # Section 4.2's "cos(s, v_0) decreases with N" says nothing where s(N) is the sink's own y_0.
        out["cos_s_sink_mixed"].append(math.nan if no_sink or top == [sink] else cos(s, values[sink]))
        out["cos_s_last_mixed"].append(math.nan if top == [sink] else cos(s, values[last]))
    rest = sum((y[i] for i in keys if i not in (sink, last)), torch.zeros(values.shape[-1], dtype=torch.float64))
    out.update(
        contribution_sink=math.nan if sink is None else float(y[sink].norm()),
        contribution_last=float(y[last].norm()),
        contribution_rest=float(rest.norm()),
        role_attention_sink=math.nan if sink is None else float(alpha[sink]),
        role_attention_last=float(alpha[last]),
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
    # ||s(N)|| is the selection metric s_norm (the regime rules read it there); the reference leaves
    # single-key rows out (NaN) for every curve, the metric does not.
    s_norm = selection_metrics(alpha, values, grid, key_mask=mask, check_sums=False).s_norm
    for r in range(len(alpha)):
        want = reference_row(alpha[r], values[r], mask[r].tolist(), grid.tolist())
        for name in CURVE_FEATURES + SCALAR_FEATURES:
            got = fast[name][r].double()
            torch.testing.assert_close(got, torch.tensor(want[name], dtype=torch.float64), equal_nan=True, msg=name)
        if int(mask[r].sum()) >= 2:
            torch.testing.assert_close(s_norm[r], torch.tensor(want["s_norm"], dtype=torch.float64), equal_nan=True)


def test_leave_one_out_norms_bound_s_norm_and_vanish_with_single_key_removed():
    # The row's top-1 key is the last token: s(1) without it is the zero vector.
    alpha = torch.tensor([[0.1, 0.2, 0.7]], dtype=torch.float64)
    values = torch.eye(3, dtype=torch.float64).unsqueeze(0)
    f = row_features(alpha, values, torch.ones(1, 3, dtype=torch.bool), torch.tensor([1, 2, 3, 4]))
    assert f["s_norm_without_last"][0, 0] == 0
    assert f["s_norm_without_sink"][0, 0] == pytest.approx(0.7)  # the sink is not in the top-1 set
    assert f["cos_s_last"][0, 0] == pytest.approx(1.0)
    assert math.isnan(f["cos_s_last"][0, 3])  # N = 4 > 3 visible keys


def layer_context(seed=0, batch=3, heads=2, queries=3, keys=7, d=4):
    """A selection context built by hand: sequences of 7, 5 and 3 real keys (right-padded), the last
    three positions of each as queries (the shortest has only two valid ones), random rows.

    Returns the context and the attention rows ``[batch, head, query, key]`` (hidden keys 0) it reads.
    """
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([keys, keys - 2, 3])[:batch]
    real = torch.arange(keys) < lengths[:, None]
    query_index = torch.stack([lengths - 1 - k for k in range(queries - 1, -1, -1)], dim=-1).clamp(min=0)
    query_valid = torch.tensor([[True, True, True], [True, True, True], [False, True, True]])[:batch, :queries]
    visible = (torch.arange(keys) <= query_index[..., None]) & real[:, None, :]  # [batch, query, key]
    alpha = torch.rand(batch, heads, queries, keys, generator=gen, dtype=torch.float64) * visible[:, None]
    values = torch.randn(batch, keys, heads, d, generator=gen, dtype=torch.float64) * real[:, :, None, None]
    # The model's pattern [batch, head, query_pos, key_pos], holding the rows at the queries' positions.
    pattern = torch.zeros(batch, heads, keys, keys, dtype=torch.float64)
    for b in range(batch):
        for q in range(queries):
            if query_valid[b, q]:
                pattern[b, :, query_index[b, q]] = alpha[b, :, q]
    sink = torch.where(visible[:, :, 0], 0, -1)  # the first real token (no left padding here)
    context = SelectionContext(
        pattern, values, visible, sink, query_valid, torch.tensor([1, 2, 4, 8]), query_index=query_index, real=real
    )
    return context, alpha


def test_role_features_of_every_valid_query_row_and_the_last_query_by_position():
    context, alpha = layer_context()
    grid = context.grid.tolist()
    batch, heads, queries, keys = alpha.shape
    seen = set()
    for chunk in context.chunks():
        out = TAXONOMY.rows(chunk, TAXONOMY.Settings())
        assert set(out) == set(ROLE_DIAGNOSTIC_FIELDS) - set(POSITION_FEATURES)  # role features: tests/test_role_features.py
        for r, (b, h, q) in enumerate(zip(chunk.batch.tolist(), chunk.head.tolist(), chunk.query.tolist(), strict=True)):
            assert context.query_valid[b, q], (b, q)  # only valid queries become rows
            seen.add((b, h, q))
            want = reference_row(alpha[b, h, q], context.values[b, :, h], context.visible[b, q].tolist(), grid)
            for name in CURVE_FEATURES + SCALAR_FEATURES:
                torch.testing.assert_close(out[name][r], torch.tensor(want[name], dtype=torch.float64), equal_nan=True, msg=name)
            assert out["cos_s_last"][r].shape == (len(grid),) and out["contribution_sink"][r].shape == ()
    valid = {(b, h, q) for b in range(batch) for h in range(heads) for q in range(queries) if context.query_valid[b, q]}
    assert seen == valid  # every valid (sequence, head, query) once
    positions = TAXONOMY.sequences(context, TAXONOMY.Settings())
    assert set(positions) == set(POSITION_FEATURES)
    for b in range(batch):
        for h in range(heads):
            q = max(q for q in range(queries) if context.query_valid[b, q])
            vis = context.visible[b, q]
            last = int(vis.nonzero().max())
            v = context.values[b, :, h]
            contribution = [float(alpha[b, h, q, i] * v[i].norm()) if vis[i] else math.nan for i in range(keys)]
            cos = [
                float(v[i] @ v[last]) / (float(v[i].norm() * v[last].norm()) + 1e-12) if vis[i] else math.nan
                for i in range(keys)
            ]
            torch.testing.assert_close(positions["contribution_by_position"][b, h], torch.tensor(contribution, dtype=torch.float64), equal_nan=True)
            torch.testing.assert_close(positions["cos_last_by_position"][b, h], torch.tensor(cos, dtype=torch.float64), equal_nan=True)
    assert positions["contribution_by_position"].shape == (batch, heads, keys)
    assert set(ROLE_DIAGNOSTIC_FIELDS) == {spec.name for spec in TAXONOMY.fields}


@pytest.mark.model
def test_features_through_the_hooks_do_not_depend_on_batching():
    model = tm.make_model("bridge-llama")
    texts = ["the cat sat on the mat and ran", "a dog", "one two three four five six seven"]
    # The features on the analysed queries (kept per query); the default query sample has tests/test_head_roles.py.
    config = dict(diagnostics=["roles"], n_grid=[1, 2, 4, 8], keep_queries=True, settings={"roles": {"queries": "analysed"}})
    together = run_with_geometry_hooks(model, texts, **config)
    alone = [run_with_geometry_hooks(model, [text], **config) for text in texts]
    for i, one in enumerate(alone):
        for name in set(ROLE_DIAGNOSTIC_FIELDS) - set(POSITION_FEATURES):
            alone_rows = one.queries[name][0]
            torch.testing.assert_close(together.queries[name][i], alone_rows, equal_nan=True, msg=name)
    # The per-position features belong to each sequence's last query: one sequence per run gives its own
    # values; together, position p averages the sequences that reach p, and padding is never counted.
    width = max(one.per_head("contribution_by_position").shape[-1] for one in alone)
    lengths = [one.n_tokens for one in alone]
    for name in POSITION_FEATURES:
        assert together.per_head(name).shape[-1] == width
        rows = []
        for one, length in zip(alone, lengths, strict=True):
            t = one.per_head(name)
            assert t.shape[-1] == length and torch.equal(one.count(name), (~t.isnan()).long()), name
            rows.append(torch.nn.functional.pad(t, (0, width - length), value=math.nan))
        stacked = torch.stack(rows)
        reaching = torch.tensor([sum(length > p for length in lengths) for p in range(width)])
        assert torch.equal(together.count(name), reaching.expand_as(together.count(name))), name
        # documents="mean" fields keep their sums in float32 (results/stats.py), so the mean of several
        # documents is good to float32 rounding, not float64.
        torch.testing.assert_close(together.per_head(name).float(), torch.nanmean(stacked, 0).float(), equal_nan=True, msg=name)
