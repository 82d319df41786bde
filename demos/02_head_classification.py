# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Head classification in a circuit study
#
# Circuit studies start from heads found by a behaviour: previous-token heads,
# induction heads. This tutorial finds them with TransformerLens's own head
# detector on a repeated-sequence prompt, then asks what the geometry says
# about them: which role (the paper's Retriever, Mixer and Reset, plus Content:
# a head whose output comes from a specific earlier token) each one has, with
# what probability, and how well it separates its top keys (Precision and
# Recall at small N). It ends with the patterns for using roles in an
# analysis: filtering heads, comparing groups, and `detect_role`, which
# scores heads in the same shape as `detect_head`.
#
# Runs in under two minutes on 2 CPU cores (`TL_GEOMETRY_DEMO_SMALL=1` uses a
# shorter prompt).

# %%
import os
import sys

import torch
from transformer_lens.head_detector import detect_head

import tl_geometry as tg
from tl_geometry.analysis.head_roles import NAMED, ROLES
from tl_geometry.report import paper_figures as plots

SMALL = os.environ.get("TL_GEOMETRY_DEMO_SMALL") == "1"


def show(fig):
    """Display a figure in a notebook; in a script run (the tests) only check that it has data."""
    assert len(fig.data) > 0, fig.layout.title.text
    if "ipykernel" in sys.modules:
        fig.show()


# %% [markdown]
# ## A repeated-sequence prompt
#
# A sentence written twice: in the second copy, an induction head attends to the
# token after the previous occurrence of the current token, and a previous-token
# head to the token just before the query.

# %%
model = tg.load_model(progress=False)
sentence = "The old lighthouse keeper climbed the spiral stairs every evening to light the lamp."
if not SMALL:
    sentence += " Ships passed far out at sea, and their crews never knew his name."
prompt = sentence + " " + sentence
tokens = model.to_tokens(prompt)  # BOS first: position 0 is the sink
n_tokens = tokens.shape[1]
first_copy = len(model.to_tokens(sentence, prepend_bos=False)[0])
print(f"{n_tokens} tokens, the first copy is positions 1..{first_copy}")

# %% [markdown]
# ## TransformerLens's head detector
#
# `detect_head` scores every head `[n_layers, n_heads]` by how much of its
# attention follows a pattern (1 = all of it).

# %%
previous_token = detect_head(model, prompt, "previous_token_head")
induction = detect_head(model, prompt, "induction_head")


def top_heads(scores: torch.Tensor, k: int = 5) -> list[tuple[int, int]]:
    """The k heads with the highest score, as (layer, head)."""
    flat = scores.flatten().topk(k).indices
    return [divmod(int(i), scores.shape[1]) for i in flat]


prev_heads, induction_heads = top_heads(previous_token), top_heads(induction)
print("previous-token heads:", [(h, round(previous_token[h].item(), 2)) for h in prev_heads])
print("induction heads:     ", [(h, round(induction[h].item(), 2)) for h in induction_heads])

# %% [markdown]
# ## Their roles, from the same prompt
#
# The queries analysed are the positions of the second copy, where induction
# happens (positions are counted from the first real token; 0 is the sink).
# By default the roles diagnostic measures its features on a seeded sample of
# query positions spread over each sequence; `settings={"roles": {"queries":
# "analysed"}}` measures them on the analysed queries instead, here the second
# copy. `diagnostics=["roles"]` computes the role features in the same pass.

# %%
second_copy = list(range(first_copy + 1, n_tokens))
result = tg.run_with_geometry_hooks(model, tokens, query_positions=second_copy, diagnostics=["roles"],
                                    settings={"roles": {"queries": "analysed"}})
roles = tg.classify_heads(result)
names = roles.label_names()
grid = result.n_grid.tolist()
at = {n: grid.index(n) for n in (2, 4)}  # at N = 1, P = R = 1 for every head

print(f"{'head':>8} {'found as':>15} {'role':>10} {'sub-type':>16} {'p(role)':>8} {'P(N=2)':>7} {'R(N=2)':>7} {'R(N=4)':>7}")
for label, heads in (("previous-token", prev_heads), ("induction", induction_heads)):
    for layer, head in heads:
        p = roles.probabilities[layer, head].max()
        print(f"{f'L{layer}H{head}':>8} {label:>15} {names[layer][head]:>10} {roles.subtype(layer, head) or '-':>16} "
              f"{p:8.2f} {roles.precision[layer, head, at[2]]:7.2f} {roles.recall[layer, head, at[2]]:7.2f} "
              f"{roles.recall[layer, head, at[4]]:7.2f}")
print(f"the top key of a Content head at the induction offset sits at lag {first_copy - 1}")

# %% [markdown]
# The roles come with their evidence: `roles.probabilities` (each role's
# share of the bootstrap replicates over documents and query positions; with
# this single prompt there is one document, so only the query positions vary),
# `roles.runner_up` and `roles.margin` (the top probability minus the
# runner-up's: below `RoleConfig.margin` the head is `"uncertain"`), and
# `roles.features` (the shares of the output, the concentration of the rest,
# the alignment with v_L over chance). `roles.describe(layer, head)` says it
# in one line. The docs page "Head roles for a circuit study" says what the
# roles do and do not claim.

# %%
show(plots.roles_by_layer(roles))
show(plots.metric_heatmap(result, "recall", 2, names))
layer, head = prev_heads[0]
print(roles.describe(layer, head))

# %% [markdown]
# ## Using labels and scores in an analysis
#
# Labels and scores are `[layer, head_index]` tensors, like `detect_head`'s
# output, so they combine with it directly. Three common patterns:
#
# 1. **Filter**: the heads of one role, as the `{layer: [heads]}` dict that
#    `detect_head`, `detect_role` and `GeometryConfig(layers=..., heads=...)`
#    style code accept.
# 2. **Compare groups**: a metric's mean over the heads found by a behaviour
#    against the rest.
# 3. **Correlate**: a behaviour score against a role's probability across
#    heads (rank correlation; the scores are not on comparable scales).

# %%
content: dict[int, list[int]] = {}
for layer, head in (roles.labels == tg.analysis.ROLE_LABELS.index("content")).nonzero().tolist():
    content.setdefault(layer, []).append(head)
print(f"{sum(map(len, content.values()))} Content heads in {len(content)} layers")

recall_n2 = roles.recall[..., at[2]]
is_prev = torch.zeros_like(recall_n2, dtype=torch.bool)
is_prev[tuple(torch.tensor(prev_heads).T)] = True
print(f"Recall(r_min, N=2): previous-token heads {recall_n2[is_prev].mean():.2f}, "
      f"other heads {recall_n2[~is_prev].nanmean():.2f}")


def spearman(x: torch.Tensor, y: torch.Tensor) -> float:
    """Rank correlation of two flattened score maps."""
    rx, ry = x.flatten().argsort().argsort().float(), y.flatten().argsort().argsort().float()
    return torch.corrcoef(torch.stack([rx, ry]))[0, 1].item()


for index, role in enumerate(NAMED):
    score = roles.probabilities[..., index].float()
    print(f"rank corr with p({role:>9}): previous-token {spearman(previous_token, score):+.2f}, "
          f"induction {spearman(induction, score):+.2f}")

# %% [markdown]
# ## `detect_role`: a drop-in for `detect_head`
#
# For code written around `detect_head`, `detect_role(model, seq, role,
# heads)` returns a `[n_layers, n_heads]` map of the role's probability (NaN
# for heads not asked for). Here it scores only the previous-token heads,
# which runs only their layers, on the default query sample of the prompt.

# %%
content_probability = tg.roles.detect_role(model, prompt, "content", heads=prev_heads)
assert content_probability.shape == previous_token.shape
for layer, head in prev_heads:
    print(f"L{layer}H{head}: previous-token {previous_token[layer, head]:.2f}, p(content) {content_probability[layer, head]:.2f}")

# %% [markdown]
# ## Roles per query position
#
# In IOI-style studies the interesting position differs from prompt to
# prompt. `classify_queries` gives every head's role at every kept query of
# every prompt, each query on its own (`keep_queries=True`, features on the
# analysed queries). One row has no bootstrap: these roles describe one
# forward pass, not a head's role.

# %%
per_query = tg.run_with_geometry_hooks(model, tokens, query_positions=second_copy, diagnostics=["roles"],
                                       keep_queries=True, settings={"roles": {"queries": "analysed"}})
queries = tg.analysis.classify_queries(per_query)
layer, head = induction_heads[0] if induction_heads else prev_heads[0]
print(f"L{layer}H{head} at each query of the second copy:",
      [ROLES[i] if i >= 0 else None for i in queries.labels[0, layer, head, : len(second_copy)].tolist()])
