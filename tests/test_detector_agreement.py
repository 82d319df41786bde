"""Detector scores against a slow reference from their definitions; the roles' cross-tab and its report section."""

import math

import pytest
import torch

from tests import tiny_models as tm
from tl_geometry.analysis.head_roles import SensitivityRow
from tl_geometry.report.roles import roles_html
from tl_geometry.roles.prompt_sets import check_known_mechanisms, detector_scores, repeated_random_tokens


def reference_scores(model, tokens, period):
    """One prompt, head and query at a time, from run_with_cache's attention patterns."""
    _, cache = model.run_with_cache(tokens)
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    out = {name: torch.zeros(n_layers, n_heads, dtype=torch.float64) for name in ("previous_token", "duplicate_token", "induction", "bos")}
    pos = tokens.shape[1]
    for layer in range(n_layers):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"].double()
        for head in range(n_heads):
            prev, dup, ind, bos, dup_rows = [], [], [], [], 0
            for p in range(tokens.shape[0]):
                for q in range(2, pos):
                    row = pattern[p, head, q]
                    prev.append(float(row[q - 1]))
                    bos.append(float(row[0]))
                    earlier = [k for k in range(q) if tokens[p, k] == tokens[p, q]]
                    if earlier:
                        dup.append(sum(float(row[k]) for k in earlier))
                    if period is not None and q >= period + 1:
                        ind.append(float(row[q - period + 1]))
            out["previous_token"][layer, head] = sum(prev) / len(prev)
            out["bos"][layer, head] = sum(bos) / len(bos)
            out["duplicate_token"][layer, head] = sum(dup) / len(dup) if dup else math.nan
            out["induction"][layer, head] = sum(ind) / len(ind) if ind else math.nan
    return out


@pytest.mark.model
def test_detector_scores_match_the_reference():
    model = tm.tiny_bridge("llama")
    tokens = repeated_random_tokens(model, n_prompts=2, period=9, seed=3)
    assert tokens.shape == (2, 19) and torch.equal(tokens[:, 1:10], tokens[:, 10:])
    assert (tokens[:, 0] == model.tokenizer.bos_token_id).all()
    assert not set(tokens[:, 1:].flatten().tolist()) & set(model.tokenizer.all_special_ids)
    model(tokens, return_type=None)  # a bridge's first forward installs hooks of its own
    hooks_before = tm.hook_counts(model)
    fast = detector_scores(model, tokens, period=9)
    assert tm.hook_counts(model) == hooks_before  # the model is left as it was
    want = reference_scores(model, tokens, 9)  # (run_with_cache on a bridge leaves hooks of its own behind)
    for name, expected in want.items():
        torch.testing.assert_close(fast[name], expected, equal_nan=True, msg=name, atol=1e-6, rtol=1e-6)


@pytest.mark.model
def test_the_check_measures_scores_and_roles_in_one_pass_as_two_separate_runs_would(capsys):
    from tl_geometry.analysis.head_roles import roles_from_result
    from tl_geometry.capture.hooks import run_with_geometry_hooks
    from tl_geometry.roles.prompt_sets import natural_text
    from tl_geometry.config import GeometryConfig

    model = tm.tiny_bridge("llama")
    model(repeated_random_tokens(model, n_prompts=1, period=4), return_type=None)  # the bridge's own first-pass hooks
    hooks_before = tm.hook_counts(model)
    passes = []
    handle = model.register_forward_pre_hook(lambda module, args: passes.append(1))
    try:
        checks = check_known_mechanisms(model, n_prompts=2, context=24, period=10, progress=True)
    finally:
        handle.remove()
    assert "tl_geometry: known-mechanism check" in capsys.readouterr().err
    assert len(passes) == 2  # one forward pass per prompt set
    assert tm.hook_counts(model) == hooks_before
    inputs = {"natural": (natural_text(model, 2, 24), None), "repeated": (repeated_random_tokens(model, 2, 10), 10)}
    for name, (tokens, period) in inputs.items():
        want = reference_scores(model, tokens, period)
        assert want["induction"].isnan().all() == (period is None)
        for detector, expected in want.items():
            torch.testing.assert_close(checks[name].scores[detector], expected, equal_nan=True, msg=f"{name} {detector}",
                                       atol=1e-6, rtol=1e-6)
        config = GeometryConfig(diagnostics=("roles",), capture="pattern")
        if period is not None:
            config = config.with_overrides(query_positions=list(range(period + 1, 2 * period + 1)),
                                           settings={"roles": {"queries": "analysed"}})
        alone = roles_from_result(run_with_geometry_hooks(model, tokens, config=config))
        torch.testing.assert_close(checks[name].roles.probabilities, alone.probabilities, msg=name)


@pytest.mark.model
def test_known_mechanisms_and_their_report_section(capsys):
    model = tm.tiny_bridge("gpt2")
    checks = check_known_mechanisms(model, n_prompts=2, context=24, period=10)
    assert "known-mechanism check" not in capsys.readouterr().err  # no bar unless asked
    assert set(checks) == {"natural", "repeated"} and checks["repeated"].period == 10
    assert checks["natural"].n_prompts == checks["repeated"].n_prompts == 2
    natural = checks["natural"]
    top = natural.top_heads("previous_token", k=3)
    scores = natural.scores["previous_token"]
    assert [float(scores[layer, head]) for layer, head in top] == sorted(scores.flatten().tolist(), reverse=True)[:3]
    expected = sum(natural.roles.subtype(layer, head) == "previous-token" for layer, head in natural.top_heads("previous_token"))
    assert natural.matches("previous_token") == expected
    table = natural.cross_tab("previous_token", k=3)  # the heads as ints and as readers see them, not "16.0"
    assert [(row["layer"], row["head"]) for row in table] == list(top)
    assert [row["name"] for row in table] == [f"L{layer}H{head}" for layer, head in top]
    assert [row["score"] for row in table] == [float(scores[layer, head]) for layer, head in top]
    page = roles_html(natural.roles, checks)
    assert "What kind of head is each one?" in page and "Induction score" in page and "Every head" in page
    assert "natural text, 2 prompts" in page and "repeated twice, 2 prompts" in page
    assert "No detector cross-tab" in roles_html(natural.roles, None)
    rows = [SensitivityRow("margin", 0.45, 3, (1, 0, 2, 4, 1))]
    assert "<td>margin</td><td>0.45</td><td>3</td><td>1</td>" in roles_html(natural.roles, None, rows)
