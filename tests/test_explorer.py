"""The head explorer's data: the attention mass of the top-N set, effective N, P and R at it, by query position.

References are written from the definitions (sum of the N largest attention
weights; the smallest grid N whose mean mass reaches 90 %), never with the
package's helpers; the packed arrays are decoded here from the documented format.
"""

import base64
import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from tests import tiny_models as tm
from tl_geometry import GeometryError, run_with_geometry_hooks
from tl_geometry.analysis.summaries import at_each_head, by_query_position, effective_n
from tl_geometry.analysis.head_roles import roles_from_result
from tl_geometry.report import explorer
from tl_geometry.results.result import REQUIRED_FIELDS

GRID = [1, 2, 3, 4, 8, 21]


@pytest.fixture(scope="module")
def model():
    return tm.make_model("bridge-llama")


@pytest.fixture(scope="module")
def tokens():
    return tm.with_bos(tm.random_tokens(3, 20))


@pytest.fixture(scope="module")
def result(model, tokens):
    return run_with_geometry_hooks(model, tokens, n_grid=GRID, diagnostics="all", capture="pattern")  # as the cache


@pytest.fixture(scope="module")
def queries(model, tokens):
    return run_with_geometry_hooks(model, tokens, n_grid=GRID, keep_queries=True, query_positions=[3, 7, 12, -1])


def _patterns(model, tokens):
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(model.cfg.n_layers)]
    _, cache = model.run_with_cache(tokens, names_filter=lambda name: name in names)
    return torch.stack([cache[name].double() for name in names], 1)  # [batch, layer, head, query, key]


def test_attention_mass_is_the_sum_of_the_n_largest_weights(model, tokens, result):
    """Definition: for the last query, sum of the N largest alpha_i over the keys it sees; mean over sequences."""
    pattern = _patterns(model, tokens)[..., -1, :]  # [batch, layer, head, key]: the last query sees every key
    expected = torch.empty(pattern.shape[1], pattern.shape[2], len(GRID), dtype=torch.float64)
    for layer in range(pattern.shape[1]):
        for head in range(pattern.shape[2]):
            for k, n in enumerate(GRID):
                sums = [sorted(pattern[b, layer, head].tolist(), reverse=True)[:n] for b in range(pattern.shape[0])]
                expected[layer, head, k] = sum(sum(s) for s in sums) / len(sums)
    torch.testing.assert_close(result.per_head("attention_mass"), expected, rtol=0, atol=1e-9)


def test_attention_mass_is_nan_beyond_the_visible_keys(queries):
    """Query position 3 sees 4 keys: N = 8 and 21 have no top-N set."""
    rows = queries.queries["attention_mass"]  # [doc, layer, head, query, n]
    at3 = rows[:, :, :, 0]
    assert bool(at3[..., GRID.index(8):].isnan().all()) and not bool(at3[..., : GRID.index(4) + 1].isnan().any())
    torch.testing.assert_close(at3[..., GRID.index(4)], torch.ones_like(at3[..., 0]), rtol=0, atol=1e-6)  # kept in float32


def _reference_effective_n(mass, grid, share):
    """Definition: the first grid N whose mean mass reaches the share (1e-6 allowed for float32 sums)."""
    out = torch.full((len(mass), len(mass[0])), math.nan, dtype=torch.float64)
    for i in range(len(mass)):
        for j in range(len(mass[0])):
            for k, n in enumerate(grid):
                if mass[i][j][k] >= share - 1e-6:
                    out[i, j] = n
                    break
    return out


@pytest.mark.parametrize("share", [0.5, 0.9, 0.99])
def test_effective_n_is_the_smallest_grid_n_reaching_the_share(result, share):
    expected = _reference_effective_n(result.per_head("attention_mass").tolist(), GRID, share)
    torch.testing.assert_close(effective_n(result, share), expected, equal_nan=True)


def test_effective_n_is_nan_where_the_grid_stops_short(model, tokens):
    short = run_with_geometry_hooks(model, tokens, n_grid=[1, 2])
    mass = short.per_head("attention_mass")
    eff = effective_n(short)
    assert bool(eff.isnan().any())  # a random model spreads its attention over more than two keys
    assert bool((eff.isnan() == (mass[..., -1] < 0.9 - 1e-6)).all())


def test_effective_n_names_what_is_missing(result):
    with pytest.raises(GeometryError, match=r"mass: expected a share of the attention in \(0, 1\]"):
        effective_n(result, 1.5)
    old = dataclasses.replace(result, stats={k: v for k, v in result.stats.items() if k != "attention_mass"})
    with pytest.raises(GeometryError, match="no field 'attention_mass'.*analyse the text again"):
        effective_n(old)


def test_at_each_head_reads_each_heads_own_n(result):
    eff = effective_n(result)
    got = at_each_head(result.per_head("precision"), result.n_grid, eff)
    for i in range(eff.shape[0]):
        for j in range(eff.shape[1]):
            n = eff[i, j].item()
            want = math.nan if math.isnan(n) else result.per_head("precision")[i, j, GRID.index(int(n))].item()
            assert (math.isnan(want) and math.isnan(got[i, j].item())) or got[i, j].item() == pytest.approx(want)


def test_by_query_position_averages_documents_at_each_position(queries):
    positions, mean = by_query_position(queries, "recall")
    rows, where = queries.queries["recall"], queries.query_positions
    assert positions == sorted({p for p in where.flatten().tolist() if p >= 0})
    for p_index, p in enumerate(positions):
        for k in range(len(GRID)):
            picked = [rows[d, 0, 1, q, k].item() for d in range(where.shape[0]) for q in range(where.shape[1])
                      if where[d, q].item() == p and not math.isnan(rows[d, 0, 1, q, k].item())]
            want = sum(picked) / len(picked) if picked else math.nan
            got = mean[0, 1, p_index, k].item()
            assert (math.isnan(want) and math.isnan(got)) or got == pytest.approx(want)


def test_by_query_position_without_rows_says_how_to_keep_them(result):
    with pytest.raises(GeometryError, match="keep_queries=True"):
        by_query_position(result, "precision")


def _unpack(packed):
    """The documented format: little-endian uint16; 0 NaN, 1 zero (log), c >= 2 -> lo + (c - 2) / 65533 (hi - lo)."""
    codes = np.frombuffer(base64.b64decode(packed["b64"]), dtype="<u2").astype(np.float64)
    values = packed["lo"] + (codes - 2) / 65533 * (packed["hi"] - packed["lo"])
    values = 10.0**values if packed["log"] else values
    values[codes == 0] = np.nan
    values[codes == 1] = 0.0
    return torch.from_numpy(values.reshape(packed["shape"]))


def test_table_and_panel_data_equal_the_result(result):
    taxonomy = roles_from_result(result)
    data = explorer.explorer_data(result, taxonomy)
    json.dumps(data, allow_nan=False)  # strict JSON: NaN became null
    eff = effective_n(result)
    table = data["table"]
    assert table["effective_n"] == [[None if math.isnan(v) else v for v in row] for row in eff.tolist()]
    for name in ("precision", "recall", "excess_precision", "excess_recall"):
        values = result.per_head(name)
        for i in range(eff.shape[0]):
            for j in range(eff.shape[1]):
                got = table[f"{name}_at_effective_n"][i][j]
                want = values[i, j, GRID.index(int(eff[i, j]))].item()
                assert got == pytest.approx(want, abs=1e-4, rel=1e-3)  # 4 significant digits
    assert table["role"] == taxonomy.label_names()
    torch.testing.assert_close(torch.tensor(data["curves"]["chance_precision"], dtype=torch.float64),
                               result.per_head("chance_precision"), rtol=1e-3, atol=1e-4)  # fmt: skip
    profile = result.per_head("attention_profile")
    decoded = _unpack(data["rows"]["attention_profile"])
    width = decoded.shape[-1]
    assert bool(profile[..., width:].isnan().all())  # only the positions no head has are trimmed
    torch.testing.assert_close(decoded, profile[..., :width], rtol=2e-3, atol=1e-12, equal_nan=True)
    cosine = _unpack(data["rows"]["cos_last_by_position"])
    torch.testing.assert_close(cosine, result.per_head("cos_last_by_position")[..., :width], rtol=0, atol=2e-5,
                               equal_nan=True)  # fmt: skip
    assert data["queries"] is None and "keep_queries=True" in data["notes"]["queries"]
    assert data["grid"][data["n_index"]] == 4


def test_query_positions_are_packed_for_every_n(queries):
    data = explorer.explorer_data(queries, None)
    positions, precision = by_query_position(queries, "precision")
    assert data["queries"]["positions"] == positions and data["queries"]["n_index"] == list(range(len(GRID)))
    torch.testing.assert_close(_unpack(data["queries"]["precision"]), precision, rtol=0, atol=2e-5, equal_nan=True)


def test_query_positions_over_budget_keep_the_first_n_shown_and_its_neighbours(queries, monkeypatch):
    monkeypatch.setattr(explorer, "QUERY_BUDGET", 2 * 2 * 4 * 4 * 2)  # 2 layers, 4 heads, 4 positions: room for two N
    data = explorer.explorer_data(queries, None)
    assert data["queries"]["n_index"] == [GRID.index(3), GRID.index(4)]  # N = 4 first, then the nearer smaller N
    assert "kept for N in [3, 4] only" in data["notes"]["queries"]
    _, precision = by_query_position(queries, "precision")
    torch.testing.assert_close(_unpack(data["queries"]["precision"]), precision[..., [2, 3]], rtol=0, atol=2e-5,
                               equal_nan=True)  # fmt: skip


def test_missing_parts_name_the_option_that_adds_them(result):
    plain = dataclasses.replace(result, stats={k: v for k, v in result.stats.items() if k in REQUIRED_FIELDS})
    notes = explorer.explorer_data(plain, None)["notes"]
    assert "'chance'" in notes["chance"] and "'bounds'" in notes["bounds"]
    assert "'assumptions'" in notes["attention"] and "'roles'" in notes["contributions"]
    assert "'roles'" in notes["role"] and "attention_mass" in notes["effective_n"]


@pytest.mark.parametrize("hostile", ["</script><script>alert(1)</script>", "<!--<script>", "</SCRIPT >&lt;"])
def test_a_hostile_string_in_the_data_cannot_leave_its_script_element(result, hostile, monkeypatch):
    """The page's data element, with a hostile string among the data: the HTML tokenizer leaves a script's text only
    at a ``<`` (to end it, or to enter the escaped states where ``<!--<script>`` makes the element's own end tag
    not end it), so the element holds none; its JSON reads back to the string intact, and the section ends there."""
    real = explorer.explorer_data

    def with_hostile(result, taxonomy=None):
        data = real(result, taxonomy)
        data["notes"]["hostile"] = hostile
        return data

    monkeypatch.setattr(explorer, "explorer_data", with_hostile)
    page = explorer.explorer_html(result, None, "<div>heatmaps</div>")
    opening = '<script type="application/json" id="explorer-data">'
    assert page.count(opening) == 1
    inside, after = page.split(opening)[1].split("</script>", 1)
    assert "<" not in inside and after == "\n</section>"
    assert json.loads(inside)["notes"]["hostile"] == hostile


def test_the_head_panel_says_what_the_upper_envelope_bounds(result):
    """With the bounds: the realised bound is drawn, each head carries the share of its measured rows above the
    theorem's upper envelope (written here from the per-row field), and the notes give kappa, sigma and the floor."""
    if "bound_precision_upper" not in result.fields:
        pytest.skip("the module's result was run without the bounds")
    data = explorer.explorer_data(result, None)
    assert "bound_precision_realised" in data["curves"] and "bound_recall_realised" in data["curves"]
    grid = result.n_grid
    inner = (grid > 1) & (grid < grid.max())
    want = result.per_head("bound_precision_upper_exceeded").double()[..., inner].nanmean(-1)
    got = torch.tensor([[math.nan if x is None else x for x in row] for row in data["table"]["precision_upper_exceeded"]],
                       dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-6, equal_nan=True)
    note = data["notes"]["envelopes"]
    assert "re-drawn" in note and "kappa = " in note and "sqrt(2 kappa d)" in note and "1 - 0.5/(N+1)" in note
