"""One selection context per layer: every diagnostic reads the same rows, ranking, sink and visible keys.

References here are written from the definitions (the paper's section 3-4
sentences and the Concepts page), one row and one N at a time, never with the
package's helpers.
"""

import importlib
import math

import pytest
import torch

from tests import tiny_models as tm
from tests.fixtures import DIFFERENCES_OF_SQUARES, ROLE_DIFFERENCES
from tests.reference import reference_margins
from tl_geometry import GeometryConfig, GeometryError, GeometryResult, analyze_corpus, run_with_geometry_hooks
from tl_geometry.capture.hook_names import pattern_hook, value_hook
from tl_geometry.capture.windows import visible_keys
from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.diagnostics.registry import REGISTRY, Diagnostic, Registry
from tl_geometry.engine.context import SelectionContext

pytestmark = pytest.mark.model

TEXTS = [
    "the cat sat on the mat and ran",
    "a dog",
    "one two three four five six seven eight nine ten house tree",
    "big red sun",
]
GRID = [1, 2, 3, 5, 8]


def _rows(model, texts):
    return [model.to_tokens(t, prepend_bos=True)[0] for t in texts]


def _padded(rows, side):
    width = max(len(r) for r in rows)
    tokens = torch.full((len(rows), width), tm.PAD_ID, dtype=torch.long)
    mask = torch.zeros_like(tokens)
    for i, r in enumerate(rows):
        span = slice(width - len(r), width) if side == "left" else slice(0, len(r))
        tokens[i, span], mask[i, span] = r, 1
    return tokens, mask




def assert_results_equal(a: GeometryResult, b: GeometryResult, rtol: float = 1e-6) -> None:
    """Every field: counts exactly equal, means (and spreads) to ``rtol``, NaN where the other has NaN."""
    assert set(a.fields) == set(b.fields)
    assert a.n_documents == b.n_documents
    for name in a.fields:
        ca, cb = a.count(name), b.count(name)
        width = min(ca.shape[-1], cb.shape[-1]) if a.spec(name).growing else None
        cut = (lambda t: t[..., :width]) if width is not None else (lambda t: t)
        assert torch.equal(cut(ca), cut(cb)), name
        atol = 1e-5 if (name in DIFFERENCES_OF_SQUARES or name in ROLE_DIFFERENCES) and rtol else 1e-9
        torch.testing.assert_close(cut(a.per_head(name)), cut(b.per_head(name)), rtol=rtol, atol=atol, equal_nan=True, msg=name)
        if a.spec(name).documents == "moments":
            torch.testing.assert_close(cut(a.std(name)), cut(b.std(name)), rtol=1e-4, atol=1e-7, equal_nan=True, msg=name)


@pytest.mark.parametrize("queries", ["last", "all"])
def test_every_field_of_every_diagnostic_ignores_padding_and_batching(queries):
    """Texts of different lengths: alone, right-padded, left-padded and in batches of 2 give the same result."""
    model = tm.make_model("compat-llama", dtype=torch.float64)
    config = GeometryConfig(
        diagnostics="all", n_grid=GRID, query_positions=queries, n_bootstrap=8, bootstrap_fields=["precision", "recall", "rho0"]
    )
    rows = _rows(model, TEXTS)
    alone = GeometryResult.merge([run_with_geometry_hooks(model, r.unsqueeze(0), config=config) for r in rows])
    right = run_with_geometry_hooks(model, TEXTS, config=config)
    tokens, mask = _padded(rows, "left")
    left = run_with_geometry_hooks(model, tokens, attention_mask=mask, config=config)
    batched = analyze_corpus(model, TEXTS, config, batch_size=2, progress=False)
    for other in (right, left, batched):
        assert_results_equal(alone, other)
    # The bootstrap weights follow the documents, not the batches.
    for name in ("precision", "recall", "rho0"):
        torch.testing.assert_close(alone.replicates(name), batched.replicates(name), rtol=1e-6, atol=1e-9, equal_nan=True)


def _order(alpha, values, keys, ranking):
    score = {i: float(alpha[i]) * (float(values[i].norm()) if ranking == "contribution" else 1.0) for i in keys}
    return sorted(keys, key=lambda i: (-score[i], i))


def _reference_features(alpha, values, keys, grid, ranking):
    """Section 4.2's quantities of one row: the sink is key 0 (BOS), L the query's own (last visible) key."""
    sink, last = keys[0], keys[-1]
    order = _order(alpha, values, keys, ranking)
    y = {i: alpha[i] * values[i] for i in keys}

    def cos(a, b):
        return float(a @ b) / (float(a.norm()) * float(b.norm()) + 1e-12)

    out = {"s_norm_without_sink": [], "cos_s_last": [], "s_norm": []}
    for n in grid:
        if n > len(keys) or len(keys) < 2:
            for name in out:
                out[name].append(math.nan)
            continue
        top = order[:n]
        s = sum((y[i] for i in top), torch.zeros_like(values[0]))
        out["s_norm"].append(float(s.norm()))
        out["s_norm_without_sink"].append(float(sum((y[i] for i in top if i != sink), torch.zeros_like(s)).norm()))
        out["cos_s_last"].append(cos(s, values[last]))
    return out


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_bounds_and_features_read_the_rows_and_ranking_of_the_metrics(distance):
    """ranking="contribution" with every query: the bounds and the taxonomy features of each kept query row
    equal references computed on that same row with that same ranking (sink = BOS, key 0). The features
    do not depend on the distance; the bounds are derived for the Euclidean one only (and refuse cosine)."""
    model = tm.make_model("bridge-llama", dtype=torch.float64)
    config = GeometryConfig(
        diagnostics=["bounds", "roles"] if distance == "euclidean" else ["roles"], n_grid=GRID,
        query_positions="all", ranking="contribution", distance=distance, keep_queries=True, n_bootstrap=0,
        settings={"roles": {"queries": "analysed"}},  # the features of the kept rows, not of the role sample
        capture="pattern",  # the rows run_with_cache sees
    )  # fmt: skip
    text = TEXTS[2]
    result = run_with_geometry_hooks(model, text, config=config)
    row = model.to_tokens(text, prepend_bos=True)
    names = [n for layer in range(tm.N_LAYERS) for n in (value_hook(layer), pattern_hook(layer))]
    _, cache = model.run_with_cache(row, names_filter=lambda n: n in names)
    group = tm.N_HEADS // tm.N_KV_HEADS
    checked = 0
    for layer in range(tm.N_LAYERS):
        pattern, v = cache[pattern_hook(layer)][0].double(), cache[value_hook(layer)][0].double()
        for head in range(tm.N_HEADS):
            for q in (1, 5, row.shape[1] - 1):
                keys = list(range(q + 1))
                alpha, values = pattern[head, q, : q + 1], v[: q + 1, head // group]
                feats = _reference_features(alpha, values, keys, GRID, "contribution")
                got = {name: result.queries[name][0, layer, head, q] for name in ("s_norm_without_sink", "cos_s_last", "s_norm")}
                for name, want in feats.items():
                    torch.testing.assert_close(got[name], torch.tensor(want, dtype=got[name].dtype), equal_nan=True, msg=name)
                if distance != "euclidean":
                    continue
                for i, n in enumerate(GRID):
                    m = reference_margins(alpha, values, torch.ones(q + 1, dtype=torch.bool), n, ranking="contribution")
                    if m is None:
                        assert math.isnan(float(result.queries["margin_delta"][0, layer, head, q, i]))
                        continue
                    for name in ("delta", "delta0", "scale", "s_in", "rho_out"):
                        got_m = float(result.queries[f"margin_{name}"][0, layer, head, q, i])
                        assert (math.isnan(got_m) and math.isnan(m[name])) or math.isclose(got_m, m[name], rel_tol=1e-9, abs_tol=1e-12), name
                    checked += 1
    assert checked > 0 or distance != "euclidean"


def test_bounds_refuse_a_distance_they_are_not_derived_for():
    with pytest.raises(GeometryError, match="'bounds' needs distance='euclidean'"):
        GeometryConfig(diagnostics=["bounds"], distance="cosine")


def test_negative_query_positions_count_from_each_end():
    model = tm.make_model("bridge-gpt2")
    last = run_with_geometry_hooks(model, TEXTS, n_grid=GRID)
    minus_one = run_with_geometry_hooks(model, TEXTS, n_grid=GRID, query_positions=[-1])
    assert_results_equal(last, minus_one, rtol=0)
    with pytest.raises(GeometryError, match="reach beyond the shortest sequence"):
        run_with_geometry_hooks(model, TEXTS, n_grid=GRID, query_positions=[-4])  # "a dog" is 3 tokens with BOS


def _window_context(window: int) -> SelectionContext:
    """One sequence of 6 keys, queries at 2 and 5, a sliding window of ``window`` keys; random rows."""
    gen = torch.Generator().manual_seed(0)
    query_index = torch.tensor([[2, 5]])
    real = torch.ones(1, 6, dtype=torch.bool)
    visible = visible_keys(query_index, real, window)
    pattern = torch.softmax(torch.randn(1, 1, 6, 6, generator=gen, dtype=torch.float64), -1)
    values = torch.randn(1, 6, 1, 3, generator=gen, dtype=torch.float64)
    sink = torch.where(visible[:, :, 0], 0, -1)
    return SelectionContext(pattern, values, visible, sink, torch.ones(1, 2, dtype=torch.bool), torch.tensor([1, 2, 3, 4]), query_index=query_index)


def test_a_window_past_the_sink_leaves_no_sink_and_nan_sink_quantities():
    from tl_geometry.diagnostics.bounds import DIAGNOSTIC as bounds
    from tl_geometry.diagnostics.role_features import DIAGNOSTIC as taxonomy

    context = _window_context(window=3)
    (chunk,) = list(context.chunks())
    assert chunk.sink.tolist() == [0, -1]  # query 2 sees keys 0-2; query 5 sees keys 3-5 only
    assert chunk.n_visible.tolist() == [3, 3]
    assert chunk.visible[1].tolist() == [False, False, False, True, True, True]
    feats = taxonomy.rows(chunk, taxonomy.Settings())
    for name in ("contribution_sink", "role_attention_sink"):
        assert not math.isnan(float(feats[name][0])) and math.isnan(float(feats[name][1])), name
    assert feats["cos_s_sink"][1].isnan().all() and not feats["cos_s_sink"][0, :3].isnan().any()
    margins = bounds.rows(chunk, bounds.Settings())
    assert margins["margin_a0"][1].isnan().all() and margins["margin_sink_selected"][1, :3].eq(0).all()
    # Hidden keys are not candidates: N = 3 selects everything the query sees (P = R = 1), N = 4 does not exist.
    from tl_geometry.engine.metrics import chunk_metrics

    metrics = chunk_metrics(chunk)
    assert metrics["precision"][:, 2].tolist() == [1.0, 1.0] and metrics["recall"][:, 2].tolist() == [1.0, 1.0]
    assert metrics["precision"][:, 3].isnan().all()


class _Toy(Diagnostic):
    name = "toy"
    fields = (FieldSpec("toy_field", "a field"),)


def test_a_field_declared_twice_is_refused_never_overwritten():
    registry = Registry(built_in=False)
    registry.register(_Toy())

    class Again(Diagnostic):
        name = "again"
        fields = (FieldSpec("toy_field", "the same name"),)

    class Twice(Diagnostic):
        name = "twice"
        fields = (FieldSpec("a", "one"), FieldSpec("a", "two"))

    with pytest.raises(GeometryError, match="declares the field 'toy_field', which diagnostic 'toy' already declares"):
        registry.register(Again())
    with pytest.raises(GeometryError, match=r"declares the field\(s\) \['a'\] more than once"):
        registry.register(Twice())
    with pytest.raises(GeometryError, match="'toy' is already registered"):
        registry.register(_Toy())
    assert registry.owner("toy_field") == "toy"  # the first declaration stands


def test_a_diagnostic_returning_recall_cannot_replace_the_real_recall():
    class Impostor(Diagnostic):
        name = "impostor"
        fields = (FieldSpec("recall", "not the real Recall", ("n",)),)

    with pytest.raises(GeometryError, match="declares the field 'recall', which diagnostic 'selection' already declares"):
        REGISTRY.register(Impostor())
    assert "impostor" not in REGISTRY.names()


class _Sloppy(Diagnostic):
    name = "sloppy"
    fields = (FieldSpec("sloppy_declared", "declared", ("n",)),)

    def rows(self, chunk, settings):
        zeros = chunk.alpha.new_zeros(len(chunk.alpha), len(chunk.grid))
        return {"sloppy_declared": zeros, "sloppy_extra": zeros}


def test_a_field_not_declared_is_refused_and_the_model_left_clean():
    """Mutant caught: the hooks reduce whatever a diagnostic returns (an undeclared field reaches the result)."""
    REGISTRY.register(_Sloppy())
    try:
        model = tm.make_model("bridge-gpt2")
        run_with_geometry_hooks(model, TEXTS, n_grid=[1, 2])  # the bridge adds its own hooks on a first pass
        before = tm.hook_counts(model)
        with pytest.raises(GeometryError, match=r"diagnostic 'sloppy': rows returned \['sloppy_extra'\], which it "
                                                r"does not declare; add a FieldSpec"):
            run_with_geometry_hooks(model, TEXTS, diagnostics=["sloppy"], n_grid=[1, 2])
        assert tm.hook_counts(model) == before
    finally:
        REGISTRY.unregister("sloppy")
    assert "sloppy" not in REGISTRY.names()
    with pytest.raises(GeometryError, match="'selection' is built in"):
        REGISTRY.unregister("selection")


def test_fields_are_read_by_declaration_or_by_name():
    from tl_geometry.diagnostics.selection import PRECISION, RECALL

    result = run_with_geometry_hooks(tm.make_model("bridge-gpt2"), TEXTS, n_grid=GRID, n_bootstrap=20)
    assert torch.equal(result.per_head(PRECISION), result.per_head("precision"))
    assert torch.equal(result.sel(RECALL, layer=1, n=2), result.sel("recall", layer=1, n=2))
    for mine, theirs in zip(result.ci(RECALL), result.ci("recall"), strict=True):
        assert torch.equal(mine, theirs)
    assert result.spec(RECALL) == RECALL and result.count(PRECISION).sum() > 0


@pytest.mark.parametrize("module", ["selection", "assumptions", "chance", "bounds", "role_features"])
def test_every_field_of_a_diagnostic_is_exported_as_a_constant(module):
    """``from tl_geometry.diagnostics.<module> import RHO0`` and the like: each declaration is a module constant
    (or in an exported tuple of them, e.g. the profile fit's), so a reader can name a field by it."""
    found = importlib.import_module(f"tl_geometry.diagnostics.{module}")
    exported = set()
    for name, value in vars(found).items():
        if name.isupper() and isinstance(value, FieldSpec):
            exported.add(value)
        elif name.isupper() and isinstance(value, tuple):
            exported |= {spec for spec in value if isinstance(spec, FieldSpec)}
    missing = [spec.name for spec in found.DIAGNOSTIC.fields if spec not in exported]
    assert not missing and found.DIAGNOSTIC.fields, missing


@pytest.mark.parametrize("module", ["selection", "assumptions", "chance", "bounds", "role_features"])
def test_each_field_constant_is_named_after_its_field(module):
    """``RHO0`` declares ``"rho0"``: a constant read where its field is meant names that field (and the profile
    fit's constants, unpacked from PROFILE_FIT, follow `ProfileFit`'s order)."""
    found = importlib.import_module(f"tl_geometry.diagnostics.{module}")
    constants = {name: value for name, value in vars(found).items() if isinstance(value, FieldSpec)}
    assert constants and all(name == spec.name.upper() for name, spec in constants.items()), constants


def test_every_built_in_field_is_declared_once_with_a_doc():
    seen = {}
    for name in REGISTRY.names():
        for spec in REGISTRY.get(name).fields:
            assert spec.name not in seen, (spec.name, name, seen.get(spec.name))
            assert spec.doc, spec.name
            seen[spec.name] = name
    assert {"precision", "recall", "rho0", "bound_recall_lower", "cos_s_last"} <= set(seen)


def test_sel_takes_real_layer_head_and_n_values():
    model = tm.make_model("bridge-gpt2")
    result = run_with_geometry_hooks(model, TEXTS, n_grid=GRID, layers=[1], heads=[2, 3])
    picked = result.sel("precision", layer=1, head=3, n=5)
    assert picked.ndim == 0
    torch.testing.assert_close(picked, result.precision[0, 1, GRID.index(5)].to(picked.dtype))
    with pytest.raises(GeometryError, match="layer"):
        result.sel("precision", layer=0)
