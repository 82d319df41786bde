"""What a result prints and shows in a notebook: a short summary (at most 25 lines), not every tensor."""

import html
import re

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tl_geometry as tg
from tests.fixtures import make_result, simulate_study, true_means
from tests.tiny_models import random_tokens, tiny_bridge, with_bos
from tl_geometry import GeometryError
from tl_geometry.interventions import intervention_sweep
from tl_geometry.results.display import MAX_LINES, WIDTH, Summary, plural, ranges, short_list
from tl_geometry.results.result import GeometryResult

MIB = 1 << 20


def check_summary(obj: object, *must: str) -> str:
    """``repr(obj)`` fits (lines, width), names every string of ``must``; its HTML table holds the same lines."""
    text = repr(obj)
    lines = text.splitlines()
    assert len(lines) <= MAX_LINES, text
    assert max(map(len, lines)) <= WIDTH, text
    for word in must:
        assert word in text, (word, text)
    page = obj._repr_html_()
    assert page.startswith("<table>") and page.count("<tr>") == len(re.findall(r"^  \S", text, re.M))
    for word in must:
        assert html.escape(word) in page, (word, page)
    return text


@pytest.fixture(scope="module")
def run():
    model = tiny_bridge()
    tokens = with_bos(random_tokens(2, 20))
    return model, tokens, tg.run_with_geometry_hooks(model, tokens, diagnostics=["roles", "assumptions"],
                                                    keep_queries=True)


def test_geometry_result_summary_names_the_sample_grid_and_fields(run):
    _, _, result = run
    text = check_summary(result, result.model_name, "2 documents", "2 layers x 4 heads", "result.sel(", "claims")
    assert f"{len(result.n_grid)} values" in text and f"{len(result.fields)}: precision, recall" in text
    assert "queries_dataframe" in text  # the per-query rows kept are said
    # The summary is not every tensor: the default dataclass repr of this result was over 150,000 characters.
    assert len(text) < 2000


def test_summary_of_a_hand_built_result_with_one_document():
    result = make_result(n_docs=1, splits=())
    text = check_summary(result, "1 document,", "layers 3, 7", "heads 1, 4, 6", "4 values: 1, 2, 4, 8")
    assert "1 documents" not in text and "replicates of recall, rho0" in text
    assert "1 documents" not in result.describe()


def test_the_read_line_of_a_summary_runs(run):
    """The example the summary gives (``result.sel(...)``) is a call that works on this result."""
    _, _, result = run
    call = re.search(r"result\.sel\([^)]*\)", repr(result)).group(0)
    assert eval(call, {"result": result}).ndim == 0


def test_a_loaded_result_prints_the_same_summary(run, tmp_path):
    _, _, result = run
    result.save(tmp_path / "r")
    assert repr(GeometryResult.load(tmp_path / "r")) == repr(result)


def test_intervention_result_summary_leaves_out_the_replicates(run):
    model, tokens, _ = run
    sweep = intervention_sweep(model, tokens, [1, 2, 4], scope="head", controls=2, progress=False, n_bootstrap=64)
    text = check_summary(sweep, "2 documents", "scope='head'", "8 units", "3 values: 1, 2, 4", "64 replicates")
    assert len(text) < 2000
    call = re.search(r"result\.sel\([^)]*\)", text).group(0)
    assert eval(call, {"result": sweep}).ndim == 0
    model_sweep = intervention_sweep(model, tokens, [2], scope="model", controls=0, progress=False, n_bootstrap=0)
    check_summary(model_sweep, "all layers at once x all heads at once", "none (n_bootstrap=0")


def test_roles_summary_counts_every_head():
    result = simulate_study(true_means(), np.random.default_rng(0))
    taxonomy = tg.classify_heads(result)
    text = check_summary(taxonomy, "4 layers x 6 heads", "roles.describe(0, 0)")
    counted = sum(int(n) for n in re.findall(r"(\d+) \w+ heads?\b", text.split("labels", 1)[1].split("\n")[0]))
    assert counted == len(taxonomy.layers) * len(taxonomy.heads)


def test_claims_table_prints_short():
    table = tg.claims(simulate_study(true_means(), np.random.default_rng(0)))
    assert len(repr(table).splitlines()) <= MAX_LINES and "<table" in table._repr_html_()


# ---------------------------------------------------------------- the helpers, over any input


@given(st.text(max_size=300),
       st.lists(st.tuples(st.text(min_size=1, max_size=20), st.text(max_size=500)), max_size=40))
def test_any_summary_fits_and_escapes(title, rows):
    summary = Summary(title, tuple(rows))
    lines = summary.text().splitlines()
    assert len(lines) <= MAX_LINES
    page = summary.html()
    assert page.count("<tr>") == len(rows) and page.count("<") == page.count(">")  # every value escaped


@given(st.lists(st.integers(0, 60), unique=True).map(sorted))
def test_ranges_reads_back_to_the_values(values):
    back = []
    for run in filter(None, ranges(values).split(", ")):
        low, _, high = run.partition("-")
        back += list(range(int(low), int(high or low) + 1))
    assert back == values


@given(st.lists(st.integers(), max_size=100))
def test_short_list_keeps_the_ends(items):
    text = short_list(items)
    assert (text.split(", ")[-1] == str(items[-1])) if items else text == ""
    assert len(text.split(", ")) <= 8


def test_plural():
    assert (plural(1, "document"), plural(2, "document"), plural(0, "query", "queries")) == \
        ("1 document", "2 documents", "0 queries")


# ---------------------------------------------------------------- an intervention sweep read as a GeometryResult is


@pytest.fixture(scope="module")
def sweep(run):
    model, tokens, _ = run
    return intervention_sweep(model, tokens, [1, 2, 4], scope="head", controls=2, progress=False, n_bootstrap=32,
                              modes=("delete",))


def test_a_sweep_reads_its_fields_by_name_like_a_result(sweep):
    torch.testing.assert_close(sweep.per_head("dnll_delete"), sweep.dnll("delete"), equal_nan=True)
    assert sweep.sel("dnll_delete", layer=1, head=2, n=4).item() == sweep.sel("delete", layer=1, head=2, n=4).item()
    for by_field, by_mode in zip(sweep.ci("dnll_delete"), sweep.ci("delete")):
        torch.testing.assert_close(by_field, by_mode, equal_nan=True)
    low, high = sweep.ci("nll_clean", level=0.5)
    assert low.shape == (2, 4) and bool((low <= high).all())
    assert sweep.sel("dnll_delete_random", n=2).shape == (2, 4, 2)  # [layer, head_index, control]
    assert sweep.sel("dnll_delete", stat="count", layer=0, head=0, n=1).item() == sweep.n_documents
    with pytest.raises(GeometryError, match=r"'dnll_delete' is a field: relative= and control= apply to a mode"):
        sweep.sel("dnll_delete", relative=True)
    with pytest.raises(GeometryError, match=r"stat: a mode gives the mean dNLL; for 'std' name a field, e.g. "
                                            r"sweep.sel\('dnll_delete', stat='std'\)"):
        sweep.sel("delete", stat="std")


def test_a_sweep_as_a_long_table(sweep):
    table = sweep.to_dataframe(form="long", level=0.9)
    assert list(table.columns) == ["field", "layer", "head", "n", "control", "mean", "std", "count", "ci_low",
                                   "ci_high"]
    assert len(table) == sum(s.count.numel() for s in sweep.stats.values())
    rows = table[(table.field == "dnll_delete") & (table.layer == 1) & (table["head"] == 3) & (table.n == 2)]
    assert len(rows) == 1 and rows["mean"].item() == pytest.approx(sweep.sel("delete", layer=1, head=3, n=2).item())
    low, high = sweep.ci("dnll_delete", level=0.9)
    assert rows["ci_low"].item() == pytest.approx(low[1, 3, 1].item())
    controls = table[table.field == "dnll_delete_random"]
    assert sorted(controls["control"].unique()) == [0.0, 1.0] and controls["ci_low"].isna().all()
    assert table[table.field != "dnll_delete_random"]["control"].isna().all()


@given(st.lists(st.lists(st.integers(0, 40), min_size=0, max_size=3), min_size=1, max_size=30))
def test_a_field_summary_fits_whatever_the_tensors(shapes):
    import dataclasses

    from tl_geometry.results.display import field_summary

    made = dataclasses.make_dataclass("Made", [(f"t{i}", object) for i in range(len(shapes))])
    obj = made(*(torch.rand(tuple(shape)) for shape in shapes))
    text = field_summary(obj, "made.t0").text()
    lines = text.splitlines()
    assert len(lines) <= MAX_LINES and max(map(len, lines)) <= WIDTH
    for i, shape in enumerate(shapes[: MAX_LINES - 3]):
        assert f"t{i}" in text and ("[" + ("x".join(map(str, shape)) or "scalar") + "]") in text


def test_analysis_results_print_a_line_per_field(run):
    model, tokens, result = run
    from tl_geometry.interventions import effective_set_size

    n_star = effective_set_size(model, tokens, taus=(0.05,), scope="layer", progress=False, n_bootstrap=64)
    text = check_summary(n_star, "[64x1x2x1]", "2 InterventionResults", "n_star.sel(")
    assert re.search(r"replicates +\[64x1x2x1\]", text) and len(text) < 1500  # not 64 x 2 replicate values
    check_summary(tg.sink_recall_correlation(result), "n_grid", "pearson", "n_bootstrap")


# ---------------------------------------------------------------- the other public result types: ablations, checks

def test_role_ablation_summary_counts_the_verdicts_not_every_row():
    from tl_geometry.analysis.role_ablation import AblationRow, HeadGroup, RoleAblation

    groups = tuple(HeadGroup(f"role {k}", "role", ((0, k),)) for k in range(40))

    def row(group, dnll):  # the band is 0 to 0.04: above it from 0.06 on, below it under -0.02
        return AblationRow(group=group, kind="role", task="natural", ablation="zero", n_heads=1, layers="0:1",
                           clean=3.0, dnll=dnll, low=dnll - 0.01, high=dnll + 0.01, random_mean=0.02, random_sd=0.01,
                           random_low=0.0, random_high=0.04, excess=dnll - 0.02, excess_low=dnll - 0.03,
                           excess_high=dnll - 0.01, above_random=0.0, n_random=8)

    dnlls = [0.5] * 3 + [0.02] * 30 + [-0.5] * 7
    ablation = RoleAblation(rows=tuple(row(g.name, d) for g, d in zip(groups, dnlls)), groups=groups, model="tiny",
                            settings={"windows": 4, "context": 64})
    text = check_summary(ablation, "RoleAblation of tiny", "40 rows", "to_markdown()")
    words = " ".join(text.split())  # long values wrap
    assert "8 random head sets: 3 above the random band, 30 in it, 7 below" in words
    assert "above band role 0 (natural, zero), role 1 (natural, zero), role 2 (natural, zero)" in words
    assert len(text) < 1500 and "role 39" not in text  # the dataclass repr printed every row's numbers


def test_published_measures_and_a_prompt_set_check_print_short(run):
    from tl_geometry.analysis.detector_agreement import PromptSetCheck
    from tl_geometry.interventions import published_measures

    model, tokens, _ = run
    check_summary(published_measures(model, tokens), "first_token_score", "[2x4]", "crosstab(roles)")
    taxonomy = tg.classify_heads(simulate_study(true_means(), np.random.default_rng(0)))
    scores = torch.arange(24, dtype=torch.float64).reshape(4, 6) / 24  # the highest: layer 3, head 5
    check = PromptSetCheck("repeated", {"induction": scores}, taxonomy, period=16, n_prompts=4)
    check_summary(check, "4 prompts, repeated", "period 16", "L3H5 0.96, L3H4 0.92", "24 heads classified",
                  "check.cross_tab('induction')")
