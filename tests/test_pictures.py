"""Selection pictures (``picture_heads``): Figure 1 on the model's data.

The reference is written from the definitions (the Concepts page and
`tl_geometry.results.selection_picture`' docstring), never from the package's helpers:
plain hooks capture hook_v and hook_pattern, and for the pictured row (the last
real query of the document with the smallest hash of its token ids) it
computes in float64 y_i = alpha_i v_i over the visible keys, the top-N set
(largest alpha, ties by the earlier key), s(N), D_i = ||s(N) - y_i||,
r_max, r_min, P = N / (N + #{non-selected j: D_j <= r_max}) and
R = #{selected i: D_i < r_min} / N. Tolerance 1e-5: the engine works in
float32 (the default) and pictures are stored in float32.
"""

import dataclasses
import hashlib
import html
import json
import math

import numpy as np
import pytest
import torch

from tests import tiny_models as tm
from tl_geometry import GeometryConfig, GeometryError, GeometryResult, run_with_geometry_hooks
from tl_geometry.results.selection_picture import SelectionPicture
from tl_geometry.report import html as report
from tl_geometry.report import paper_figures as plots
from tl_geometry.results.accumulators import Accumulator

ATOL = 1e-5


# ---------------------------------------------------------------- the reference


def reference_hash(tokens: torch.Tensor) -> int:
    """SHA-256 of the tag and the int64 little-endian token ids: the first 8 bytes, little-endian, shifted to 63 bits."""
    body = tokens.to(torch.int64).numpy().astype("<i8").tobytes()
    return int.from_bytes(hashlib.sha256(b"tl_geometry.picture/1" + body).digest()[:8], "little") >> 1


def captured(model, tokens, mask, layer):
    """hook_v and hook_pattern of one layer, with plain hooks: ([batch, pos, kv_head, d_head], [batch, head, q, k])."""
    kept = {}

    def keep(name):
        def hook(tensor, hook):
            kept[name] = tensor.detach().clone()

        return hook

    kwargs = {} if mask is None else {"attention_mask": mask}
    hooks = [(f"blocks.{layer}.attn.hook_v", keep("v")), (f"blocks.{layer}.attn.hook_pattern", keep("pattern"))]
    with torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=hooks, return_type=None, **kwargs)
    return kept["v"], kept["pattern"]


def reference_picture(model, tokens, mask, layer, head, grid, window=None):
    """Every quantity of the picture of (layer, head), from the definitions, in float64."""
    real = torch.ones_like(tokens, dtype=torch.bool) if mask is None else mask.bool()
    docs = [(reference_hash(tokens[b][real[b]]), b) for b in range(len(tokens))]
    document, b = min(docs)
    v, pattern = captured(model, tokens, mask, layer)
    first = int(real[b].nonzero()[0])
    q = int(real[b].nonzero()[-1])  # the last real token: the last analysed query
    keys = [k for k in range(q + 1) if bool(real[b, k]) and (window is None or k > q - window)]
    group = model.cfg.n_heads // (getattr(model.cfg, "n_key_value_heads", None) or model.cfg.n_heads)
    alpha = {k: float(pattern[b, head, q, k]) for k in keys}
    y = {k: alpha[k] * v[b, k, head // group].double() for k in keys}
    ranked = sorted(keys, key=lambda k: (-alpha[k], k))
    out = {"document": document, "query_position": q - first, "positions": [k - first for k in keys],
           "alpha": [alpha[k] for k in keys], "y": torch.stack([y[k] for k in keys]),
           "order": [keys.index(k) for k in ranked], "sink": keys.index(first) if first in keys else -1,
           "s": [], "r_max": [], "r_min": [], "precision": [], "recall": [], "in_r_max": [], "in_r_min": []}
    for n in grid:
        if n > len(keys):
            out["s"].append(torch.full((v.shape[-1],), math.nan, dtype=torch.float64))
            for name in ("r_max", "r_min", "precision", "recall"):
                out[name].append(math.nan)
            out["in_r_max"].append([False] * len(keys))
            out["in_r_min"].append([False] * len(keys))
            continue
        chosen, rest = ranked[:n], ranked[n:]
        s = sum((y[k] for k in chosen), torch.zeros(v.shape[-1], dtype=torch.float64))
        d = {k: float((s - y[k]).norm()) for k in keys}
        r_max = max(d[k] for k in chosen)
        r_min = min((d[k] for k in rest), default=math.inf)
        out["s"].append(s)
        out["r_max"].append(r_max)
        out["r_min"].append(r_min)
        out["precision"].append(n / (n + sum(d[k] <= r_max for k in rest)))
        out["recall"].append(sum(d[k] < r_min for k in chosen) / n)
        out["in_r_max"].append([d[k] <= r_max for k in keys])
        out["in_r_min"].append([d[k] < r_min for k in keys])
    out["s"] = torch.stack(out["s"])
    return out


def assert_matches(picture: SelectionPicture, ref: dict) -> None:
    for name in ("document", "query_position", "sink"):
        assert getattr(picture, name) == ref[name], name
    for name in ("positions", "order"):
        assert getattr(picture, name).tolist() == ref[name], name
    for name in ("in_r_max", "in_r_min"):
        assert getattr(picture, name).tolist() == ref[name], name
    for name in ("alpha", "y", "s", "r_max", "r_min", "precision", "recall"):
        expected = torch.as_tensor(ref[name], dtype=torch.float64)
        torch.testing.assert_close(getattr(picture, name).double(), expected, atol=ATOL, rtol=0, equal_nan=True,
                                   msg=name)  # fmt: skip


needs_hooked = [pytest.mark.tl3, pytest.mark.skipif(not tm.has_hooked_transformer(), reason="needs transformer-lens 3.x")]


@pytest.mark.model
@pytest.mark.parametrize("kind", ["bridge-gpt2", "compat-llama", pytest.param("hooked", marks=needs_hooked)])
def test_picture_equals_the_reference_with_left_padding_and_every_query_analysed(kind):
    # Every query analysed: the picture must be the last one (a picture of the first query would fail).
    # float32: a raw bridge over Llama in float64 turns fully masked pad rows into NaN (see test_hooks).
    model = tm.make_model(kind, dtype=torch.float32)
    rows = [tm.with_bos(tm.random_tokens(1, n, seed=n))[0] for n in (7, 12, 9, 10)]
    tokens, mask = tm.left_padded(rows)
    grid = [1, 2, 3, 5, 8, 11, 40]  # 40: beyond every query's keys (NaN, no member)
    config = GeometryConfig(picture_heads=[(0, 1), (1, 3)], n_grid=grid, query_positions="all")
    result = run_with_geometry_hooks(model, tokens, attention_mask=mask, config=config)
    assert [(p.layer, p.head) for p in result.pictures] == [(0, 1), (1, 3)]
    for layer, head in ((0, 1), (1, 3)):
        ref = reference_picture(model, tokens, mask, layer, head, grid)
        picture = result.picture(layer, head)
        assert_matches(picture, ref)
        assert min(picture.positions.tolist()) == 0  # no padding key: positions count from BOS
    # The measured values are the run's own: P and R of the pictured row are among those the run averaged.
    assert result.count("precision")[0, 1, 0] == len(rows)


@pytest.mark.model
def test_picture_equals_the_reference_on_a_sliding_window_layer():
    model = tm.tiny_window_bridge("mistral", compat=False)  # window 3 on every layer
    tokens = tm.with_bos(tm.random_tokens(2, 11, seed=3))
    grid = [1, 2, 3, 4]
    result = run_with_geometry_hooks(model, tokens, picture_heads=[(1, 2)], n_grid=grid)
    ref = reference_picture(model, tokens, None, 1, 2, grid, window=3)
    picture = result.picture(1, 2)
    assert_matches(picture, ref)
    assert picture.positions.tolist() == [9, 10, 11] and picture.sink == -1  # keys outside the window are absent
    assert math.isnan(picture.precision[-1]) and math.isinf(picture.r_min[2])  # N = 4 > 3 keys; N = 3: all selected


def test_ranked_by_contribution_the_order_follows_alpha_times_the_value_norm():
    model = tm.make_model("bridge-gpt2")
    tokens = tm.with_bos(tm.random_tokens(1, 9))
    result = run_with_geometry_hooks(model, tokens, picture_heads=[(0, 0)], n_grid=[1, 2], ranking="contribution")
    picture = result.picture(0, 0)
    score = torch.linalg.vector_norm(picture.y.double(), dim=-1)  # alpha_i ||v_i|| = ||y_i||
    expected = sorted(range(picture.n_keys), key=lambda k: (-float(score[k]), k))
    assert picture.order.tolist() == expected and picture.ranking == "contribution"


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(("pairs", "kwargs", "message"), [
    ([(2, 0)], {}, r"\(2, 0\) is not a head of this model, which has 2 layers \(cfg.n_layers\)"),
    ([(0, 4)], {}, r"4 heads per layer \(cfg.n_heads\); use layers 0..1 and heads 0..3"),
    ([(1, 0)], {"layers": [0]}, r"not analysed by this run .*add layer 1 and head 0 to layers / heads"),
    ([(0, 3)], {"heads": [0, 1]}, r"add layer 0 and head 3"),
])  # fmt: skip
def test_unknown_or_unanalysed_heads_are_refused_and_the_model_is_left_as_it_was(pairs, kwargs, message):
    model = tm.make_model("bridge-gpt2")
    before = tm.hook_counts(model)
    with pytest.raises(GeometryError, match=message):
        run_with_geometry_hooks(model, tm.with_bos(tm.random_tokens(1, 5)), picture_heads=pairs, **kwargs)
    assert tm.hook_counts(model) == before


@pytest.mark.parametrize(("value", "message"), [
    ("18.6", "expected a sequence of \\(layer, head\\) pairs, e.g. \\[\\(18, 6\\)\\]"),
    ([(1,)], "the entry \\(1,\\) is not a \\(layer, head\\) pair"),
    ([(1, -2)], "not a \\(layer, head\\) pair of non-negative integers"),
    ([(1, 2), [1, 2]], "names a head twice"),
])  # fmt: skip
def test_the_config_refuses_what_is_not_a_list_of_pairs(value, message):
    with pytest.raises(GeometryError, match=message):
        GeometryConfig(picture_heads=value)
    assert GeometryConfig(picture_heads=[[3, 1], (0, 2)]).picture_heads == ((0, 2), (3, 1))


def test_the_command_line_takes_repeated_layer_dot_head():
    from tl_geometry.cli import build_parser, config_from_args

    args = build_parser().parse_args(["analyze", "--picture", "18.6", "--picture", "0.1"])
    assert config_from_args(args).picture_heads == ((0, 1), (18, 6))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["analyze", "--picture", "18,6"])


def test_asking_for_a_picture_the_run_did_not_keep_names_the_option():
    model = tm.make_model("bridge-gpt2")
    result = run_with_geometry_hooks(model, tm.with_bos(tm.random_tokens(1, 5)), n_grid=[1])
    with pytest.raises(GeometryError, match=r"picture_heads=\[\(1, 2\)\] \(tl-geometry --picture 1.2\)"):
        result.picture(1, 2)


# ---------------------------------------------------------------- files, merge, accumulators


@pytest.fixture(scope="module")
def parts():
    """Four documents of equal length (no padding): one result over all, and one per document."""
    model = tm.make_model("bridge-gpt2")
    tokens = tm.with_bos(tm.random_tokens(4, 10, seed=7))
    config = GeometryConfig(picture_heads=[(0, 2), (1, 0)], n_grid=[1, 2, 4, 11], n_bootstrap=4)
    whole = run_with_geometry_hooks(model, tokens, config=config)
    single = [run_with_geometry_hooks(model, tokens[i : i + 1], config=config) for i in range(4)]
    hashes = [reference_hash(tokens[i]) for i in range(4)]
    return whole, single, hashes


def test_save_and_load_round_trip_and_old_files_load_without_pictures(parts, tmp_path):
    whole, _, _ = parts
    whole.save(tmp_path / "r")
    loaded = GeometryResult.load(tmp_path / "r")
    assert loaded.equals(whole) and len(loaded.pictures) == 2
    assert all(a.equals(b) for a, b in zip(loaded.pictures, whole.pictures))
    plain = dataclasses.replace(whole, pictures=(), config=dataclasses.replace(whole.config, picture_heads=()))
    plain.save(tmp_path / "old")
    meta = json.loads((tmp_path / "old.json").read_text())
    del meta["pictures"]  # as written before pictures existed (the .npz, and so its checksum, is unchanged)
    (tmp_path / "old.json").write_text(json.dumps(meta))
    assert GeometryResult.load(tmp_path / "old").pictures == ()


def test_a_file_whose_picture_announces_more_keys_than_tokens_is_refused(parts, tmp_path):
    whole, _, _ = parts
    whole.save(tmp_path / "r")
    meta = json.loads((tmp_path / "r.json").read_text())
    meta["pictures"][0]["n_keys"] = meta["n_tokens"] + 1
    (tmp_path / "r.json").write_text(json.dumps(meta))
    with pytest.raises(GeometryError, match="more than the .* tokens analysed"):
        GeometryResult.load(tmp_path / "r")


def test_merge_keeps_the_picture_of_the_smallest_document_hash_in_any_order(parts):
    whole, single, hashes = parts
    smallest = int(np.argmin(hashes))
    orders = [[0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1]]
    merged = [GeometryResult.merge([single[i] for i in order]) for order in orders]
    nested = single[0].merge(single[1]).merge(single[2].merge(single[3]))
    for result in [*merged, nested]:
        assert result.pictures[0].document == hashes[smallest] == whole.pictures[0].document
        for a, b in zip(result.pictures, merged[0].pictures):
            assert a.equals(b)  # commutative and associative, exactly
        for a, b in zip(result.pictures, single[smallest].pictures):
            assert a.equals(b)
    # The same document analysed in a batch of four: the same row, up to the batch's rounding.
    for a, b in zip(merged[0].pictures, whole.pictures):
        torch.testing.assert_close(a.y, b.y, atol=ATOL, rtol=0)
        assert a.order.tolist() == b.order.tolist()


def test_a_result_without_pictures_merges_with_one_with_pictures(parts):
    _, single, _ = parts
    plain = dataclasses.replace(single[0], pictures=(), config=dataclasses.replace(single[0].config, picture_heads=()))
    for merged in (plain.merge(single[1]), single[1].merge(plain)):
        assert merged.config.picture_heads == ((0, 2), (1, 0))
        assert all(a.equals(b) for a, b in zip(merged.pictures, single[1].pictures))
        assert merged.n_documents == 2


def test_accumulator_state_and_reduction_carry_the_pictures(parts):
    _, single, hashes = parts
    pictures = [p for result in single for p in result.pictures]
    specs = [single[0].spec("recall")]

    def accumulator():
        return Accumulator(specs, layers=(0, 1), heads=(0, 1, 2, 3), n_grid=single[0].n_grid, picture_heads=((0, 2), (1, 0)))

    acc = accumulator()
    acc.add({"recall": torch.zeros(1, 2, 4, 4)}, torch.zeros(1, 0), n_tokens=1, pictures=pictures[:4])
    restored = accumulator()
    import io

    buffer = io.BytesIO()
    torch.save(acc.state_dict(), buffer)
    buffer.seek(0)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert [p.document for p in restored.pictures.values()] == [p.document for p in acc.pictures.values()]
    other = accumulator()
    other.add({"recall": torch.zeros(1, 2, 4, 4)}, torch.zeros(1, 0), n_tokens=1, pictures=pictures[4:])

    def all_reduce(t, op):
        return t * 2 if op == "sum" else t

    reduced = acc.reduced(all_reduce, lambda obj: [obj, [{**p.metadata(), **p.arrays()} for p in other.pictures.values()]])
    assert {p.document for p in reduced.pictures.values()} == {min(hashes[:2] + hashes[2:])}


# ---------------------------------------------------------------- the drawing


@pytest.fixture(scope="module")
def picture():
    model = tm.make_model("bridge-gpt2")
    tokens = tm.with_bos(tm.random_tokens(1, 30, seed=11))
    return run_with_geometry_hooks(model, tokens, picture_heads=[(1, 1)], n_grid=[1, 2, 3, 4, 8, 31]).picture(1, 1)


def numpy_projection(picture):
    """The first two principal directions of the y_i (numpy's SVD of the centred rows)."""
    y = picture.y.double().numpy()
    centre = y.mean(0)
    _, _, vh = np.linalg.svd(y - centre, full_matrices=False)
    return centre, vh[:2]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8, 31])
def test_the_figure_draws_the_stored_row(picture, n):
    fig = plots.selection_picture(picture, n, slider=[1, 2, 3, 4, 8, 31])
    centre, basis = numpy_projection(picture)
    keys, s_traces = fig.data[0], [t for t in fig.data if t.name == "s(N)"]
    drawn_basis = plots.picture_projection(picture)[1].numpy()
    # The same plane as numpy's (the signs of principal directions are arbitrary): equal projectors.
    np.testing.assert_allclose(drawn_basis.T @ drawn_basis, basis.T @ basis, atol=1e-9)
    xy = np.stack([keys.x, keys.y], -1)
    np.testing.assert_allclose(xy, (picture.y.double().numpy() - centre) @ drawn_basis.T, atol=1e-9)
    i = picture.n_grid.tolist().index(n)
    s_xy = (picture.s[i].double().numpy() - centre) @ drawn_basis.T
    (shown,) = [t for t in s_traces if t.visible]
    np.testing.assert_allclose([shown.x[0], shown.y[0]], s_xy, atol=1e-9)
    discs = {shape.line.dash: shape for shape in fig.layout.shapes}
    for dash, radius in (("dot", float(picture.r_max[i])), ("dash", float(picture.r_min[i]))):
        if math.isinf(radius):  # every key selected: no r_min ball
            assert dash not in discs
            continue
        disc = discs[dash]
        assert disc.x1 - disc.x0 == pytest.approx(2 * radius) and disc.y1 - disc.y0 == pytest.approx(2 * radius)
        assert ((disc.x0 + disc.x1) / 2, (disc.y0 + disc.y1) / 2) == pytest.approx(tuple(s_xy))
    stars = {k for k, symbol in enumerate(keys.marker.symbol) if symbol.startswith("star")}
    assert stars == set(picture.order[:n].tolist())
    # Colours and fills follow the true membership in d_head dimensions.
    for k, symbol in enumerate(keys.marker.symbol):
        inside = bool(picture.in_r_min[i, k]) if k in stars else bool(picture.in_r_max[i, k])
        assert symbol.endswith("-open") != inside, (k, symbol)
    assert [step["label"] for step in fig.layout.sliders[0].steps] == ["1", "2", "3", "4", "8", "31"]
    step = fig.layout.sliders[0].steps[[1, 2, 3, 4, 8, 31].index(n)]
    assert step["args"][0]["marker.symbol"][0] == list(keys.marker.symbol)
    assert [s["line"]["dash"] for s in step["args"][1]["shapes"]] == [s.line.dash for s in fig.layout.shapes]


def test_the_figure_hovers_position_alpha_and_norm_and_marks_the_sink(picture):
    fig = plots.selection_picture(picture, 2)
    custom = np.array(fig.data[0].customdata)
    np.testing.assert_array_equal(custom[:, 0], picture.positions.numpy())
    np.testing.assert_allclose(custom[:, 1], picture.alpha.double().numpy())
    np.testing.assert_allclose(custom[:, 2], np.linalg.norm(picture.y.double().numpy(), axis=-1))
    sink = fig.data[1]
    assert sink.name == "sink" and (sink.x[0], sink.y[0]) == (fig.data[0].x[picture.sink], fig.data[0].y[picture.sink])
    with pytest.raises(GeometryError, match=r"no top-N set for N = 5; choose one of \[1, 2, 3, 4, 8, 31\]"):
        plots.selection_picture(picture, 5)


# ---------------------------------------------------------------- the report


def test_the_report_draws_each_picture_next_to_the_toy_or_names_the_option():
    model = tm.make_model("bridge-gpt2")
    tokens = tm.with_bos(tm.random_tokens(2, 12))
    with_pictures = run_with_geometry_hooks(model, tokens, picture_heads=[(0, 3), (1, 1)])
    page = report.render_html(with_pictures)
    at = [page.index(f'id="section-{key}"') for key in
          ("figure-1", "figure-1-model-0-3", "figure-1-model-1-1", "figure-2")]  # fmt: skip
    assert at == sorted(at)
    assert html.escape("keys outside it may land in the disc too") in page
    assert "this run kept no selection pictures" not in page
    plain = run_with_geometry_hooks(model, tokens)
    page = report.render_html(plain)
    note = page[page.index('id="section-figure-1-model"'):]
    assert note.index("--picture L.H") < note.index("picture_heads=[(L, H)]") < note.index("</section>")
    assert page.index('id="section-figure-1"') < page.index('id="section-figure-1-model"') < page.index(
        'id="section-figure-2"')
