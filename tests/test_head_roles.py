"""Head roles: heads built to be each role, through the whole pipeline, against reference rules.

A head is "built" by a hook that replaces a tiny model's attention pattern
and value vectors before the geometry hooks read them: every query row of
every document gets the weights and values of the role, so the run goes
through the query sample, the two-stage bootstrap and the rules as a real
one does. The reference rules below are written from the module docstring of
`tl_geometry.analysis.head_roles` (the paper's sentences, section 4.2), in plain
Python one head at a time; they share only the thresholds with the package.

Mutants and the test that catches each (run by hand, or shown inside the test):
- share_sink and share_self swapped in the rules: test_built_heads_come_out_as_built (inside);
- the alignment without its chance correction (raw cosine): test_aligned_only_by_chance_is_not_a_retriever;
- concentration read as "at most" instead of "at least": test_built_heads_come_out_as_built;
- the label without the margin (argmax alone): test_labels_follow_the_margin;
- the sub-type's share over the rows that reach the offset (not all rows): test_built_heads_come_out_as_built
  (the secondary sink is then a "lag" of a late row);
- no peak test (a recency-biased head named previous-token): test_built_heads_come_out_as_built (inside);
- a secondary sink left Content: test_built_heads_come_out_as_built;
- the literal Reset without its sink-biased alignment: test_literal_rules_match_the_reference.
"""

import dataclasses
import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests import tiny_models as tm
from tests.mutants import Mutant, assert_caught, wrap_function
from tests.reference import (
    LITERAL,
    reference_literal_role,
    reference_role,
    reference_subtype,
    reference_subtype_probability,
)
from tl_geometry.analysis import head_roles as taxonomy_module
from tl_geometry.analysis.detector_agreement import CONFIRMED, agreement
from tl_geometry.analysis.head_roles import (
    LITERAL_ROLES,
    ROLE_LABELS,
    ROLES,
    SUBTYPE_KINDS,
    RoleConfig,
    classify_queries,
    labels_from_probabilities,
    literal_role_of,
    role_of,
    subtypes_from_features,
    roles_from_result,
    threshold_sensitivity,
)
from tl_geometry.capture.hooks import run_with_geometry_hooks
from tl_geometry.config import GeometryConfig
from tl_geometry.diagnostics.role_features import LITERAL_FEATURES, ROLE_FEATURES, SUBTYPE_FEATURES, ROLE_DIAGNOSTIC_FIELDS
from tl_geometry.errors import GeometryError
from tl_geometry.results.result import GeometryResult
from tl_geometry.roles.classify import classify_heads, detect_role
from tl_geometry.roles.prompt_sets import detector_scores

D = 8  # the tiny GPT-2's d_head
N_DOC, POS, PERIOD = 8, 48, 20


def _unit(x):
    return x / x.norm(dim=-1, keepdim=True)


def built_row(role: str, q: int, n_keys: int, v: torch.Tensor, doc: int = 0) -> torch.Tensor:
    """The attention weights of query q of document ``doc`` for a head built to be ``role`` (sink 0, own token q)."""
    a = torch.zeros(n_keys, dtype=torch.float64)
    if q == 0:
        a[0] = 1.0
        return a
    spread = list(range(1, q))
    if role in ("retriever", "aligned_by_chance"):
        a[0], a[q], mass = 0.1, 0.7, 0.2
    elif role == "sink":
        a[0], a[q], mass = 0.7, 0.02, 0.28
    elif role == "mixer":
        a[0], a[q], mass = 0.5, 0.3, 0.2
    elif role == "broad":
        a[: q + 1] = 1.0
        return a / a.sum()
    elif role == "secondary_sink":  # every later query's top rest key is one early key, another in each document
        secondary = 2 + doc % 5
        if q > secondary:
            a[0], a[q], a[secondary], mass = 0.25, 0.05, 0.6, 0.1
            spread = [k for k in spread if k != secondary]
        else:
            a[0], a[q], mass = 0.6, 0.2, 0.2
    elif role == "recency":  # weights decaying by 0.6 a lag: the previous token wins every row, with no peak
        a[0], a[q] = 0.15, 0.05
        decay = torch.tensor([0.6**lag for lag in range(1, q)], dtype=torch.float64)
        if q > 1:
            a[1:q] = (0.8 * decay / decay.sum()).flip(0)  # key q - lag gets 0.6^lag
        else:
            a[0] += 0.8
        return a / a.sum()
    elif role in ("previous", "induction"):
        target = q - 1 if role == "previous" else q - PERIOD + 1
        if 0 < target < q:
            a[0], a[q], a[target], mass = 0.15, 0.05, 0.7, 0.1
            spread = [k for k in spread if k != target]
        else:
            a[0], a[q], mass = 0.5, 0.2, 0.3
    else:
        raise ValueError(role)
    if spread:
        a[spread] = mass / len(spread)
    else:
        a[0] += mass
    return a / a.sum()


def built_values(role: str, n_keys: int, gen: torch.Generator) -> torch.Tensor:
    """Value vectors: random unit directions; for the Mixer the context leans towards each query's own value."""
    v = _unit(torch.randn(n_keys, D, generator=gen, dtype=torch.float64))
    if role == "aligned_by_chance":  # every key nearly parallel: s(N) and any random set point the same way
        v = _unit(v[0] + 0.05 * v)
    return v


def building_hooks(roles_by_layer: dict[int, list[str]], n_doc: int, pos: int, seed: int = 0):
    """Hooks that replace the pattern and values of the given layers' heads with built ones."""
    gen = torch.Generator().manual_seed(seed)
    hooks = []
    for layer, roles in roles_by_layer.items():
        values = torch.zeros(n_doc, pos, len(roles), D, dtype=torch.float64)
        pattern = torch.zeros(n_doc, len(roles), pos, pos, dtype=torch.float64)
        for d in range(n_doc):
            for h, role in enumerate(roles):
                v = built_values(role, pos, gen)
                values[d, :, h] = v
                for q in range(pos):
                    pattern[d, h, q] = built_row(role, q, pos, v, d)
        hooks.append((f"blocks.{layer}.attn.hook_pattern", lambda t, hook, p=pattern: p.to(t.dtype)))
        hooks.append((f"blocks.{layer}.attn.hook_v", lambda t, hook, v=values: v.to(t.dtype)))
    return hooks


@pytest.fixture(scope="module")
def gpt2():
    return tm.tiny_bridge("gpt2")


ROLES_BUILT = {0: ["retriever", "sink", "broad", "previous"], 1: ["secondary_sink", "recency", "aligned_by_chance", "previous"]}
EXPECTED = {"retriever": "retriever", "sink": "reset", "broad": "reset", "previous": "content", "secondary_sink": "reset",
            "recency": "content"}


@pytest.fixture(scope="module")
def built(gpt2):
    tokens = tm.with_bos(tm.random_tokens(N_DOC, POS - 1))
    with gpt2.hooks(fwd_hooks=building_hooks(ROLES_BUILT, N_DOC, POS)):
        return run_with_geometry_hooks(gpt2, tokens, diagnostics=["roles"], n_bootstrap=100)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.floats(-0.2, 1), min_size=7, max_size=7), errors=st.lists(st.floats(0.001, 0.2), min_size=3, max_size=3),
       share_errors=st.lists(st.floats(0, 0.1), min_size=3, max_size=3), nan_sink=st.booleans())
def test_rules_match_the_reference(values, errors, share_errors, nan_sink):
    names = ("share_sink", "share_self", "share_rest", "align_self_excess", "shift_self_raw", "shift_sink_raw", "top_rest_share")
    f = dict(zip(names, values))
    f["top_rest_share"] = abs(f["top_rest_share"])
    if nan_sink:
        f["share_sink"] = math.nan
    se = dict(zip(("align_self_excess", "shift_self_raw", "shift_sink_raw"), errors))
    se.update(zip(("share_sink", "share_self", "share_rest"), share_errors))
    cfg = RoleConfig()
    got = role_of({k: torch.tensor([v], dtype=torch.float64) for k, v in f.items()},
                  {k: torch.tensor([v], dtype=torch.float64) for k, v in se.items()}, cfg)  # fmt: skip
    assert int(got) == reference_role(f, se, cfg)


@given(gap=st.floats(0.001, 0.2), se=st.floats(0.0005, 0.1))
def test_a_mixer_needs_its_own_share_above_the_sink_by_its_noise(gap, se):
    """Own token 'between' sink and rest only where the gap to the sink beats z_shift standard errors of it."""
    one = lambda v: torch.tensor([v], dtype=torch.float64)  # noqa: E731
    f = {"share_sink": one(0.05), "share_self": one(0.05 + gap), "share_rest": one(0.9 - gap), "align_self_excess": one(0.0),
         "shift_self_raw": one(0.1), "shift_sink_raw": one(-0.1), "top_rest_share": one(0.5)}  # fmt: skip
    errors = {k: one(se) for k in f} | {"shift_self_raw": one(0.001), "shift_sink_raw": one(0.001)}
    cfg = RoleConfig()
    assume(abs(gap - cfg.z_shift * math.sqrt(2) * se) > 1e-9)  # not on the edge, where rounding decides
    mixer = ROLES[int(role_of(f, errors, cfg))] == "mixer"
    assert mixer == (gap > cfg.z_shift * math.sqrt(2) * se)


LITERAL_NAMES = ("contribution_sink", "contribution_last", "contribution_top_rest", "cos_sink_raw", "cos_self_raw",
                 "shift_self_raw", "shift_sink_raw", "top_rest_share")  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.floats(-0.3, 1), min_size=8, max_size=8), errors=st.lists(st.floats(0.001, 0.2), min_size=2, max_size=2),
       nan_sink=st.booleans())
def test_literal_rules_match_the_reference(values, errors, nan_sink):
    f = dict(zip(LITERAL_NAMES, values))
    for name in ("contribution_sink", "contribution_last", "contribution_top_rest", "top_rest_share"):
        f[name] = abs(f[name])
    if nan_sink:
        f["contribution_sink"] = math.nan
    se = dict(zip(("shift_self_raw", "shift_sink_raw"), errors))
    cfg = RoleConfig()
    got = literal_role_of({k: torch.tensor([v], dtype=torch.float64) for k, v in f.items()},
                          {k: torch.tensor([v], dtype=torch.float64) for k, v in se.items()}, cfg)  # fmt: skip
    assert LITERAL_ROLES == LITERAL and int(got) == reference_literal_role(f, se, cfg)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), reach=st.integers(3, 9))
def test_subtypes_match_the_reference(data, reach):
    """Per-lag and early-key means drawn at random (with ties and NaN), one head at a time against the reference."""
    share = st.one_of(st.sampled_from([0.0, 0.25, 0.5]), st.floats(0, 1))
    draw = {name: data.draw(st.lists(share, min_size=reach, max_size=reach)) for name in
            ("top_rest_at_lag", "attention_at_lag", "output_share_at_lag")}  # fmt: skip
    early = {name: data.draw(st.one_of(share, st.just(math.nan))) for name in ("top", "attention", "output")}
    features = {name: torch.tensor(v, dtype=torch.float64).view(1, 1, -1) for name, v in draw.items()}
    features.update({f"early_{name}": torch.tensor([[early[key]]], dtype=torch.float64) for key, name in
                     (("top", "top_rest"), ("attention", "attention"), ("output", "output_share"))})  # fmt: skip
    features["early_position"] = torch.tensor([[3.0]], dtype=torch.float64)
    cfg = RoleConfig()
    found = subtypes_from_features(features, cfg)
    want_kind, want_lag = reference_subtype(
        {"top": draw["top_rest_at_lag"], "attention": draw["attention_at_lag"], "output": draw["output_share_at_lag"]},
        early, cfg,
    )  # fmt: skip
    assert SUBTYPE_KINDS[int(found.kind[0, 0])] == want_kind
    assert int(found.lag[0, 0]) == want_lag


# ---- heads built to be each role ----


@pytest.mark.model
def test_built_heads_come_out_as_built(built):
    found = roles_from_result(built)
    margin = RoleConfig().margin
    for layer, roles in ROLES_BUILT.items():
        for head, role in enumerate(roles):
            if role not in EXPECTED:
                continue
            want = ROLES.index(EXPECTED[role])
            p = found.probabilities[layer, head]
            assert ROLE_LABELS[int(found.labels[layer, head])] == EXPECTED[role], (layer, head, role, p)
            others = torch.cat([p[:want], p[want + 1 :]])
            assert float(p[want] - others.max()) >= margin, (layer, head, role, p)
    assert found.subtype(0, 3) == "previous-token" and found.subtype(1, 3) == "previous-token"
    assert int(found.subtypes.lag[0, 3]) == 1 and float(found.subtypes.rows[0, 3]) > 0.8
    # The secondary sink: an early key (positions 2-6, by document) wins every later row, and is Reset.
    assert found.subtype(1, 0) == "secondary sink", found.describe(1, 0)
    assert 2 < float(found.subtypes.position[1, 0]) < 6 and float(found.subtypes.rows[1, 0]) == 1.0
    assert float(found.probabilities[1, 0, ROLES.index("content")]) == 0.0
    assert int(found.point[1, 0]) == ROLES.index("reset")
    # The recency-biased head: the previous token is its top rest key in every row, but its weight has no peak.
    assert float(found.subtypes.rows[1, 1]) > 0.8 and int(found.subtypes.lag[1, 1]) == 1
    assert found.subtype(1, 1) is None, found.describe(1, 1)
    # Mutant: no peak test: the recency-biased head would be named previous-token.
    no_peak = dataclasses.replace(found.config, subtype_peak=1.0)
    assert SUBTYPE_KINDS[int(subtypes_from_features(found.features, no_peak).kind[1, 1])] == "lag"
    # Strength on the named key, against the built weights (0.7 of 1.0 at the previous token where it exists).
    assert 0.5 < float(found.subtypes.attention[0, 3]) <= 0.7 + 1e-9
    # Mutant: share_sink and share_self swapped: the Retrievers stop being Retrievers.
    swapped = {**found.features, "share_sink": found.features["share_self"], "share_self": found.features["share_sink"]}
    assert int(role_of(swapped, found.se, found.config)[0, 0]) != ROLES.index("retriever")
    # Mutant: concentration as "at most": the previous-token heads stop being Content.
    loose = dataclasses.replace(found.config, concentrated=1.0)
    assert int(role_of(found.features, found.se, loose)[0, 3]) != ROLES.index("content")


@pytest.mark.model
def test_aligned_only_by_chance_is_not_a_retriever(built):
    """Own token dominant and cos(s(N), v_L) near 1, but random sets of the same weights align as much."""
    found = roles_from_result(built)
    raw = built.per_head("cos_s_last")[1, 2]
    assert float(torch.nanmean(raw)) > 0.9  # a raw-cosine threshold (the old rule's 0.5) would call it a Retriever
    assert float(found.features["share_self"][1, 2]) > 0.5
    assert ROLE_LABELS[int(found.labels[1, 2])] != "retriever"
    assert abs(float(found.features["align_self_excess"][1, 2])) < 0.05


@pytest.mark.model
def test_a_shifting_mixer_and_an_induction_head(gpt2):
    tokens = tm.with_bos(tm.random_tokens(N_DOC, PERIOD))
    tokens = torch.cat([tokens, tokens[:, 1:]], dim=1)  # BOS, then the same PERIOD tokens twice
    pos = tokens.shape[1]
    second_copy = list(range(PERIOD + 1, pos))
    with gpt2.hooks(fwd_hooks=mixer_and_induction_hooks(N_DOC, pos)):
        result = run_with_geometry_hooks(
            gpt2, tokens, diagnostics=["roles"], layers=[0], query_positions=second_copy,
            settings={"roles": {"queries": "analysed"}},
        )  # fmt: skip
    found = roles_from_result(result)
    labels = found.label_names()[0]
    assert labels[0] == "mixer", found.describe(0, 0)
    assert labels[1] == "content" and found.subtype(0, 1) == f"lag {PERIOD - 1}", found.describe(0, 1)
    assert labels[2] == labels[3] == "reset"


def mixer_and_induction_hooks(n_doc: int, pos: int, seed: int = 1):
    """Layer 0: a Mixer (sink first, own token between sink and rest, the context leaning towards v_L) and an
    induction head (weight on the key after the previous occurrence of the query's token), then a sink and a
    broad head."""
    gen = torch.Generator().manual_seed(seed)
    pattern = torch.zeros(n_doc, 4, pos, pos, dtype=torch.float64)
    values = torch.zeros(n_doc, pos, 4, D, dtype=torch.float64)
    for d in range(n_doc):
        for h, role in enumerate(("mixer", "induction", "sink", "broad")):
            v = built_values(role, pos, gen)
            values[d, :, h] = v
            for q in range(pos):
                pattern[d, h, q] = built_row(role, q, pos, v)
    # The Mixer's context leans towards one direction u that every token's value shares (cos 0.8), so that
    # adding context keys to s(N) turns it towards each query's own v_L; the sink is orthogonal to u.
    v_last = values[:, -1, 0]  # u
    values[:, 1:-1, 0] = _unit(0.8 * v_last.unsqueeze(1) + 0.6 * values[:, 1:-1, 0])
    values[:, 0, 0] = _unit(values[:, 0, 0] - (values[:, 0, 0] * v_last).sum(-1, keepdim=True) * v_last)
    return [("blocks.0.attn.hook_pattern", lambda t, hook: pattern.to(t.dtype)),
            ("blocks.0.attn.hook_v", lambda t, hook: values.to(t.dtype))]  # fmt: skip


# ---- probabilities and labels ----


@pytest.mark.model
def test_probabilities_are_the_share_of_replicates_giving_each_role(built):
    found = roles_from_result(built)
    replicates = {name: built.replicates(name) for name in ROLE_FEATURES}
    n_rep = replicates["share_self"].shape[0]
    for layer in range(tm.N_LAYERS):
        for head in range(tm.N_HEADS):
            reps = built.replicates("share_self")[:, layer, head]
            se = {}
            for k in ("align_self_excess", "shift_self_raw", "shift_sink_raw", "share_sink", "share_self", "share_rest"):
                x = [float(v) for v in replicates[k][:, layer, head] if not math.isnan(v)]
                mean = sum(x) / len(x)
                se[k] = math.sqrt(sum((v - mean) ** 2 for v in x) / (len(x) - 1))
            votes = [0] * len(ROLES)
            for b in range(n_rep):
                if math.isnan(float(reps[b])):
                    continue
                role = reference_role({k: float(v[b, layer, head]) for k, v in replicates.items()}, se, found.config)
                votes[role] += 1
            # A secondary sink is Reset: its Content votes count for Reset.
            names = (("top", "top_rest"), ("attention", "attention"), ("output", "output_share"))
            at_lag = {key: built.per_head(f"{name}_at_lag")[layer, head].tolist() for key, name in names}
            early = {key: float(built.per_head(f"early_{name}")[layer, head]) for key, name in names}
            if reference_subtype(at_lag, early, found.config)[0] == "sink":
                votes[ROLES.index("reset")] += votes[ROLES.index("content")]
                votes[ROLES.index("content")] = 0
            want = torch.tensor(votes, dtype=torch.float64) / sum(votes)
            torch.testing.assert_close(found.probabilities[layer, head], want, msg=str((layer, head)))


@settings(max_examples=100, deadline=None)
@given(p=st.lists(st.floats(0, 1), min_size=4, max_size=4).filter(lambda p: sum(p) > 0), margin=st.floats(0, 1))
def test_labels_follow_the_margin(p, margin):
    probs = torch.tensor(p, dtype=torch.float64) / sum(p)
    label, runner_up, gap = labels_from_probabilities(probs, margin)
    ordered = sorted(probs.tolist(), reverse=True)
    assert float(gap) == pytest.approx(ordered[0] - ordered[1])
    if ordered[0] - ordered[1] >= margin + 1e-9:
        assert int(label) == int(probs.argmax())
    elif ordered[0] - ordered[1] < margin - 1e-9:
        assert ROLE_LABELS[int(label)] == "uncertain"
    assert float(probs[int(runner_up)]) == pytest.approx(ordered[1])


# ---- the rest of the API ----


@pytest.mark.model
def test_summaries_and_sensitivity(built):
    found = roles_from_result(built)
    curves = found.curves_by_role("precision")
    assert curves.shape == (len(ROLE_LABELS), len(built.n_grid))
    for i in range(len(ROLE_LABELS)):
        members = built.precision[found.labels == i]
        if len(members):
            torch.testing.assert_close(curves[i], torch.nanmean(members, 0), equal_nan=True)
        else:
            assert curves[i].isnan().all()
    examples = found.example_heads()
    for i, regime in enumerate(ROLE_LABELS):
        assert (examples[regime] is None) == (not (found.labels == i).any())
    assert found.counts_by_layer().sum().item() == tm.N_LAYERS * tm.N_HEADS
    rows = threshold_sensitivity(built)
    for row in rows:
        moved = roles_from_result(built, RoleConfig(**{row.threshold: row.value}))
        assert row.changed == int((moved.labels != found.labels).sum())
        assert list(row.counts) == moved.counts_by_layer().sum(0).tolist()
    # Heads named as everywhere else ("L0H3"), not "0.3", which reads as a number.
    assert found.describe(0, 0).startswith("L0H0: retriever")
    assert found.describe(0, 3).startswith("L0H3: content (previous-token: top rest key in 100 % of rows, weight 0.")
    table = found.table()
    assert len(table) == tm.N_LAYERS * tm.N_HEADS and all(abs(sum(r[f"p_{k}"] for k in ROLES) - 1) < 1e-9 for r in table)


@pytest.mark.model
def test_merge_and_batching_leave_the_probabilities_unchanged(gpt2):
    tokens = tm.with_bos(tm.random_tokens(6, 30, seed=3))
    config = GeometryConfig(diagnostics=["roles"], n_bootstrap=50)
    whole = run_with_geometry_hooks(gpt2, tokens, config=config)
    parts = GeometryResult.merge([run_with_geometry_hooks(gpt2, tokens[i : i + 2], config=config) for i in (0, 2, 4)])
    for name in ROLE_FEATURES:  # a result rounds these replicate sums to float16 (results/stats.py, half_rounded):
        # once for the whole, once per part and once more merged, each within half a float16 ulp (2**-11) of a
        # weighted sum of the documents' (query-resampled) means: at most 3 * 2**-11 of the largest such mean
        a, b = whole.replicates(name), parts.replicates(name)
        assert torch.equal(a.isnan(), b.isnan()), name
        largest = float(torch.cat([a, b]).abs().nan_to_num().max())
        assert float((a - b).abs().nan_to_num().max()) <= 3 * 2**-11 * largest, name
    assert torch.equal(roles_from_result(whole).labels, roles_from_result(parts).labels)
    other_seed = run_with_geometry_hooks(gpt2, tokens, config=config.with_overrides(settings={"roles": {"seed": 1}}))
    assert not torch.equal(whole.per_head("share_self"), other_seed.per_head("share_self"))  # the sample moved


@pytest.mark.model
def test_per_query_roles(gpt2):
    tokens = tm.with_bos(tm.random_tokens(2, 20, seed=4))
    result = run_with_geometry_hooks(gpt2, tokens, diagnostics=["roles"], query_positions="all", keep_queries=True,
                                     settings={"roles": {"queries": "analysed"}})  # fmt: skip
    per_query = classify_queries(result)
    assert per_query.labels.shape[:3] == (2, tm.N_LAYERS, tm.N_HEADS)
    assert per_query.at(0, 0) == [[None] * tm.N_HEADS] * tm.N_LAYERS  # the sink sees only itself
    assert all(label in ROLES for row in per_query.at(0, 10) for label in row)
    with pytest.raises(GeometryError, match="kept no query at position 999"):
        per_query.at(0, 999)
    sampled = run_with_geometry_hooks(gpt2, tokens, diagnostics=["roles"], keep_queries=True)
    with pytest.raises(GeometryError, match="queries': 'analysed'"):
        classify_queries(sampled)


@pytest.mark.model
def test_errors_and_old_results(gpt2, built):
    plain = run_with_geometry_hooks(gpt2, tm.with_bos(tm.random_tokens(1, 8)), n_grid=[1, 2])
    with pytest.raises(GeometryError, match="lacks the role features .* diagnostics=\\['roles'\\]"):
        classify_heads(plain)
    old = dataclasses.replace(built, stats={k: v for k, v in built.stats.items() if k not in ROLE_FEATURES})
    assert any(name in old.fields for name in ROLE_DIAGNOSTIC_FIELDS)
    with pytest.raises(GeometryError, match="older role diagnostic .* analyse the model again"):
        roles_from_result(old)
    # A result of the version before: its Mixer on the excess shifts (that version's rule), no sub-type, and it
    # says so; its labels are those of the earlier rules (the reference with the excess shifts in their place).
    newer = (*SUBTYPE_FEATURES, *LITERAL_FEATURES, "shift_self_raw", "shift_sink_raw")
    before = dataclasses.replace(built, stats={k: v for k, v in built.stats.items() if k not in newer})
    found = roles_from_result(before)
    assert set(found.missing) == set(newer)
    assert all(found.subtype(layer, head) is None for layer in found.layers for head in found.heads)
    assert (found.literal == -1).all() and "earlier version lacks shift_sink_raw" in found.describe(0, 3)
    se = {name: found.se[name] for name in ("align_self_excess", "shift_self_raw", "shift_sink_raw", "share_sink",
                                            "share_self", "share_rest")}  # fmt: skip
    torch.testing.assert_close(se["shift_self_raw"], built.sem("shift_self"), equal_nan=True)  # no replicates here
    for layer, head in ((0, 0), (0, 3), (1, 2)):
        f = {k: float(built.per_head(k)[layer, head]) for k in ROLE_FEATURES if not k.endswith("_raw")}
        f.update({f"{k}_raw": float(built.per_head(k)[layer, head]) for k in ("shift_self", "shift_sink")})
        assert int(found.point[layer, head]) == reference_role(f, {k: float(v[layer, head]) for k, v in se.items()}, found.config)
    from tl_geometry.report.html import render_figures

    assert render_figures(old).roles is None  # the report of an old result draws the rest and says why not
    with pytest.raises(GeometryError, match="tokens: required when classify_heads gets a model"):
        classify_heads(gpt2)
    with pytest.raises(GeometryError, match="only used with a model"):
        classify_heads(plain, "a b")
    with pytest.raises(GeometryError, match="role_config: expected a RoleConfig or None, got dict"):
        classify_heads(gpt2, "a b", role_config={})
    with pytest.raises(GeometryError, match="role: expected one of .*, got 'uncertain'"):
        detect_role(gpt2, "a b", "uncertain")
    for kwargs, message in (({"margin": 2.0}, "margin: expected a number in [0, 1], got 2.0"),
                            ({"z_align": -1.0}, "z_align: expected a number of standard errors >= 0, got -1.0"),
                            ({"concentrated": 0.0}, "concentrated: expected a share in (0, 1], got 0.0"),
                            ({"z_shift": math.nan}, "z_shift: expected a finite number, got nan")):  # fmt: skip
        with pytest.raises(GeometryError) as info:
            RoleConfig(**kwargs)
        assert str(info.value) == message


@pytest.mark.model
def test_detect_role_has_detect_heads_shape(gpt2):
    text = "the cat sat on the mat and ran"
    found = classify_heads(gpt2, text)
    scores = detect_role(gpt2, text, "reset")
    assert scores.shape == (tm.N_LAYERS, tm.N_HEADS)
    torch.testing.assert_close(scores.double(), found.probabilities[..., ROLES.index("reset")], equal_nan=True)
    some = detect_role(gpt2, text, "content", heads=[(1, 2), (0, 0)])
    others = torch.ones_like(some, dtype=torch.bool)
    others[1, 2] = others[0, 0] = False
    assert some[others].isnan().all() and not some[~others].isnan().any()


@pytest.mark.model
def test_precision_counts_the_named_heads_a_detector_confirms(gpt2, built):
    """The detector reads the built patterns: the previous-token heads score 0.7, the recency head 0.32."""
    found = roles_from_result(built)
    tokens = tm.with_bos(tm.random_tokens(N_DOC, POS - 1))
    with gpt2.hooks(fwd_hooks=building_hooks(ROLES_BUILT, N_DOC, POS)):
        scores = detector_scores(gpt2, tokens)["previous_token"]
    named = agreement(found, scores, "previous-token")
    assert set(named.named) == {(0, 3), (1, 3)} and named.confirmed == named.named and named.precision == 1.0
    assert 0.3 < float(scores[1, 1]) < 0.35  # the recency head: the detector's cut alone counts it, the peak does not
    detected = {(layer, head) for layer in found.layers for head in found.heads if float(scores[layer, head]) >= 0.3}
    assert set(named.detected) == detected and (1, 1) in detected
    assert named.recall == len(detected & set(named.named)) / len(detected) < 1
    assert agreement(found, scores, "previous-token", threshold=0.8).confirmed == ()
    assert math.isnan(agreement(found, scores, "lag 7").precision)
    assert math.isnan(agreement(found, scores * 0, "previous-token").recall)  # no head detected


def test_a_named_key_carries_the_weight_the_detectors_call_that_kind_of_head():
    """The sub-type weight floor is the detectors' cut: a head named previous-token is one the detector would count."""
    assert RoleConfig().subtype_attention == CONFIRMED


# ---- a sub-type near a floor is uncertain ----


@settings(max_examples=300, deadline=None)
@given(data=st.data(), reach=st.integers(3, 7))
def test_subtype_probability_matches_the_reference(data, reach):
    """Means and standard errors drawn at random (0, NaN and ties included), against the loop over floors."""
    share = st.one_of(st.sampled_from([0.0, 0.1, 0.25, 0.3, 0.5]), st.floats(0, 1))
    error = st.one_of(st.sampled_from([0.0, math.nan]), st.floats(1e-4, 0.3))
    names = ("top_rest_at_lag", "attention_at_lag", "output_share_at_lag")
    means = {name: data.draw(st.lists(share, min_size=reach, max_size=reach)) for name in names}
    errors = {name: data.draw(st.lists(error, min_size=reach, max_size=reach)) for name in names}
    early = {key: data.draw(st.one_of(share, st.just(math.nan))) for key in ("top", "attention", "output")}
    early_se = {key: data.draw(error) for key in ("top", "attention", "output")}
    early_names = {"top": "early_top_rest", "attention": "early_attention", "output": "early_output_share"}
    features = {name: torch.tensor(v, dtype=torch.float64).view(1, 1, -1) for name, v in means.items()}
    features.update({early_names[k]: torch.tensor([[v]], dtype=torch.float64) for k, v in early.items()})
    features["early_position"] = torch.tensor([[3.0]], dtype=torch.float64)
    se = {name: torch.tensor(v, dtype=torch.float64).view(1, 1, -1) for name, v in errors.items()}
    se.update({early_names[k]: torch.tensor([[v]], dtype=torch.float64) for k, v in early_se.items()})
    cfg = RoleConfig(margin=data.draw(st.sampled_from([0.0, 0.5, 0.9])))
    found = subtypes_from_features(features, cfg, se)
    short = {"top_rest_at_lag": "top", "attention_at_lag": "attention", "output_share_at_lag": "output"}
    kind, probability, uncertain = reference_subtype_probability(
        {short[n]: v for n, v in means.items()}, {short[n]: v for n, v in errors.items()}, early, early_se, cfg
    )
    assert SUBTYPE_KINDS[int(found.kind[0, 0])] == kind
    assert float(found.probability[0, 0]) == pytest.approx(probability, abs=1e-9)
    assert bool(found.uncertain[0, 0]) == uncertain


def _one_head(attention: float, attention_se: float) -> tuple[dict, dict]:
    """A previous-token head's means (its weight ``attention`` at lag 1, clearly past every other floor) and errors."""
    features = {
        "top_rest_at_lag": torch.tensor([[[0.0, 0.9, 0.05, 0.0]]], dtype=torch.float64),
        "attention_at_lag": torch.tensor([[[0.2, attention, 0.05, 0.02]]], dtype=torch.float64),
        "output_share_at_lag": torch.tensor([[[0.1, 0.5, 0.02, 0.0]]], dtype=torch.float64),
        "early_top_rest": torch.tensor([[0.0]], dtype=torch.float64),
        "early_attention": torch.tensor([[0.01]], dtype=torch.float64),
        "early_output_share": torch.tensor([[0.0]], dtype=torch.float64),
        "early_position": torch.tensor([[math.nan]], dtype=torch.float64),
    }
    se = {name: torch.full_like(t, 0.01) for name, t in features.items() if name != "early_position"}
    se["attention_at_lag"] = torch.full_like(features["attention_at_lag"], attention_se)
    return features, se


def _features_config_se(attention: float, attention_se: float, cfg: RoleConfig) -> tuple[dict, RoleConfig, dict]:
    features, se = _one_head(attention, attention_se)
    return features, cfg, se


def _near_the_floor_is_uncertain() -> None:
    """Weight 0.31 with SE 0.05 (z = 0.2): neither named nor ruled out; 0.31 with SE 0.001 named; 0.2 ruled out."""
    cfg = RoleConfig()
    near = taxonomy_module.subtypes_from_features(*_features_config_se(0.31, 0.05, cfg))
    assert bool(near.uncertain[0, 0]) and SUBTYPE_KINDS[int(near.kind[0, 0])] == "none"
    assert 0.25 < float(near.probability[0, 0]) < 0.75
    sure = taxonomy_module.subtypes_from_features(*_features_config_se(0.31, 0.001, cfg))
    assert not bool(sure.uncertain[0, 0]) and SUBTYPE_KINDS[int(sure.kind[0, 0])] == "lag"
    low = taxonomy_module.subtypes_from_features(*_features_config_se(0.2, 0.01, cfg))
    assert not bool(low.uncertain[0, 0]) and SUBTYPE_KINDS[int(low.kind[0, 0])] == "none"


def test_a_sub_type_near_its_floor_is_uncertain():
    _near_the_floor_is_uncertain()


def test_mutant_sub_types_judged_on_means_alone_is_caught():
    """The spread dropped (every floor judged on the mean): the head at 0.31 +- 0.05 would be named."""
    drop = wrap_function(taxonomy_module, "subtypes_from_features", lambda f: lambda features, config, se=None: f(features, config))
    assert_caught(Mutant("sub-types without their spread", drop, (_near_the_floor_is_uncertain,)))


@pytest.mark.model
def test_built_heads_sub_type_probability_from_the_documents(built):
    """Through roles_from_result: each head's probability is the reference's on the result's means and sem."""
    found = roles_from_result(built)
    cfg = found.config
    assert built.n_documents > 1
    mean = {n: built.per_head(n) for n in SUBTYPE_FEATURES}
    sem = {n: built.sem(n) for n in SUBTYPE_FEATURES}
    for i in range(len(found.layers)):
        for j in range(len(found.heads)):
            at = {k: mean[n][i, j].tolist() for k, n in (("top", "top_rest_at_lag"), ("attention", "attention_at_lag"),
                                                         ("output", "output_share_at_lag"))}  # fmt: skip
            at_se = {k: sem[n][i, j].tolist() for k, n in (("top", "top_rest_at_lag"), ("attention", "attention_at_lag"),
                                                           ("output", "output_share_at_lag"))}  # fmt: skip
            early = {k: float(mean[n][i, j]) for k, n in (("top", "early_top_rest"), ("attention", "early_attention"),
                                                           ("output", "early_output_share"))}  # fmt: skip
            early_se = {k: float(sem[n][i, j]) for k, n in (("top", "early_top_rest"), ("attention", "early_attention"),
                                                             ("output", "early_output_share"))}  # fmt: skip
            if all(math.isnan(x) for x in at["top"]):
                continue
            _, probability, uncertain = reference_subtype_probability(at, at_se, early, early_se, cfg)
            assert float(found.subtypes.probability[i, j]) == pytest.approx(probability, abs=1e-9), (i, j)
            assert bool(found.subtypes.uncertain[i, j]) == uncertain, (i, j)
    # The heads built to be previous-token are named with certainty; the recency-biased head is ruled out.
    assert float(found.subtypes.probability[0, 3]) > 0.75 and float(found.subtypes.probability[1, 1]) < 0.25


@pytest.mark.model
def test_a_result_without_the_lag_spread_judges_sub_types_on_means(built, tmp_path):
    """A file whose lag features kept means only (an earlier version's declaration) loads; it says so, and no
    sub-type is uncertain: each is the means' rule."""
    import hashlib
    import json

    import numpy as np

    json_path = tmp_path / "old.json"
    built.save(tmp_path / "old")
    meta = json.loads(json_path.read_text())
    edited = 0
    for field in meta["fields"]:
        if field["name"] in ("top_rest_at_lag", "attention_at_lag", "output_share_at_lag"):
            field["documents"] = "mean"
            edited += 1
    assert edited == 3
    # The arrays as that version wrote them: count and a float32 total, no sum of squares, minimum or maximum.
    npz_path = tmp_path / "old.npz"
    with np.load(npz_path) as arrays:
        kept = {}
        for key in arrays.files:
            field, _, statistic = key.rpartition("/")
            if field in ("top_rest_at_lag", "attention_at_lag", "output_share_at_lag"):
                if statistic in ("total_sq", "minimum", "maximum"):
                    continue
                kept[key] = arrays[key].astype(np.float32) if statistic == "total" else arrays[key]
            else:
                kept[key] = arrays[key]
    np.savez_compressed(npz_path, **kept)
    meta["npz_sha256"] = hashlib.sha256(npz_path.read_bytes()).hexdigest()
    json_path.write_text(json.dumps(meta))
    old = GeometryResult.load(tmp_path / "old")
    found = roles_from_result(old)
    assert {f"{n} spread" for n in ("top_rest_at_lag", "attention_at_lag", "output_share_at_lag")} <= set(found.missing)
    assert not bool(found.subtypes.uncertain.any())
    on_means = subtypes_from_features(found.features, found.config)
    assert torch.equal(found.subtypes.kind, on_means.kind)
    assert "lacks" in found.describe(0, 3)


@pytest.mark.model
def test_subtype_agreement_counts_as_a_loop_over_pairs(built):
    """Three taxonomies with sub-types drawn at random (named, uncertain or none per head), against a loop over
    every pair of them and every head of what each names."""
    from tl_geometry.analysis.head_roles import subtype_agreement

    found = roles_from_result(built)
    gen = torch.Generator().manual_seed(3)
    variants = []
    for _ in range(3):
        draw = torch.randint(0, 3, found.labels.shape, generator=gen)  # 0 none, 1 named, 2 uncertain
        lag = torch.randint(1, 3, found.labels.shape, generator=gen)
        subtypes = dataclasses.replace(
            found.subtypes, kind=torch.where(draw == 1, SUBTYPE_KINDS.index("lag"), 0),
            candidate=torch.full_like(draw, SUBTYPE_KINDS.index("lag")), lag=lag, uncertain=draw == 2,
        )  # fmt: skip
        labels = torch.full_like(found.labels, ROLE_LABELS.index("content"))
        variants.append(dataclasses.replace(found, subtypes=subtypes, labels=labels))
    got = subtype_agreement(variants)
    heads = [(l, h) for l in found.layers for h in found.heads]
    names = [{lh: v.subtype(*lh) for lh in heads} for v in variants]
    unsure = [{lh: v.subtype_uncertain(*lh) is not None for lh in heads} for v in variants]
    want = dict.fromkeys(("same_both", "both", "same_sure", "sure", "same_either", "either"), 0)
    for i in range(3):
        for j in range(i + 1, 3):
            for lh in heads:
                a, b = names[i][lh], names[j][lh]
                if a is not None or b is not None:
                    want["either"] += 1
                    want["same_either"] += a == b
                    if not (unsure[i][lh] or unsure[j][lh]):
                        want["sure"] += 1
                        want["same_sure"] += a == b
                if a is not None and b is not None:
                    want["both"] += 1
                    want["same_both"] += a == b
    assert {k: getattr(got, k) for k in want} == want
    assert got.uncertain == tuple(sum(u.values()) for u in unsure)
    assert want["either"] > want["sure"] > 0 and want["both"] > 0 and want["either"] > want["same_either"]  # each branch taken
