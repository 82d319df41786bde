"""Bad inputs to the model-facing functions get a GeometryError naming the problem and the fix, and leave the
model exactly as it was (no hooks behind): out-of-vocabulary or narrow token ids, things that are not
TransformerLens models, a device that is not there, sequences longer than the context, empty strings."""

import os
import subprocess
import sys

import pytest
import torch

from tl_geometry.capture.hooks import run_with_geometry_hooks
from tl_geometry.errors import GeometryError
from tl_geometry.models import check_device, load_model
from tl_geometry.runs.corpus_run import analyze_corpus
from tests import tiny_models as tm


@pytest.fixture(scope="module")
def model():
    return tm.make_model("bridge-llama")


def refused(model, message, call):
    before = tm.hook_counts(model)
    with pytest.raises(GeometryError, match=message):
        call()
    assert tm.hook_counts(model) == before


def test_token_ids_outside_the_vocabulary(model):
    tokens = tm.with_bos(tm.random_tokens(2, 6))
    too_big = tokens.clone()
    too_big[1, 3] = tm.VOCAB_SIZE
    refused(model, rf"id {tm.VOCAB_SIZE} is outside the model's vocabulary 0..{tm.VOCAB_SIZE - 1}",
            lambda: run_with_geometry_hooks(model, too_big))
    negative = tokens.clone()
    negative[0, 2] = -1
    refused(model, r"id -1 is outside .*mark padding with attention_mask",
            lambda: analyze_corpus(model, negative, progress=False))


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16])
def test_narrow_integer_tokens(model, dtype):
    tokens = tm.with_bos(tm.random_tokens(1, 5)).to(dtype)
    refused(model, rf"expected int64 \(or int32\) token ids, got dtype {dtype}.*tokens.long\(\)",
            lambda: run_with_geometry_hooks(model, tokens))


def test_int32_tokens_are_accepted(model):
    tokens = tm.with_bos(tm.random_tokens(1, 5))
    a = run_with_geometry_hooks(model, tokens, n_grid=[1, 2])
    b = run_with_geometry_hooks(model, tokens.int(), n_grid=[1, 2])
    assert torch.equal(a.precision, b.precision)


NOT_MODELS = """
import torch
from tl_geometry import analyze_corpus, run_with_geometry_hooks
from tl_geometry.errors import GeometryError

for thing in (None, torch.nn.Linear(4, 4), "gpt2"):  # (a transformers model is taken: test_held_models)
    for call in (lambda: run_with_geometry_hooks(thing, torch.ones(1, 4, dtype=torch.long)),
                 lambda: analyze_corpus(thing, ["some text"], progress=False)):
        try:
            call()
        except GeometryError as error:
            print(error)
"""


def test_things_that_are_not_transformerlens_models():
    """Run without the test suite's runtime type checks, which would stop these calls first."""
    done = subprocess.run([sys.executable, "-c", NOT_MODELS], capture_output=True, text=True, cwd=os.getcwd(),
                          env={**os.environ, "PYTHONPATH": os.getcwd()}, timeout=300)
    lines = done.stdout.splitlines()
    assert len(lines) == 6, done.stderr
    assert all(line.startswith("model: expected a TransformerLens model") for line in lines)
    assert [line.split("), got ")[1].split(";")[0] for line in lines[::2]] == ["None", "Linear", "str"]
    assert "load one with tl_geometry.load_model(name)" in lines[2]


HELD_WITHOUT_TOKENIZER = """
import time, torch, transformers
from tl_geometry import run_with_geometry_hooks
from tl_geometry.errors import GeometryError

config = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=1, vocab_size=64)
start = time.perf_counter()
try:
    run_with_geometry_hooks(transformers.AutoModelForCausalLM.from_config(config), torch.ones(1, 4, dtype=torch.long))
except GeometryError as error:
    print(error)
print(time.perf_counter() - start)
"""


def test_a_held_model_without_a_tokenizer_is_refused_without_asking_the_hub():
    """A plain transformers model is taken (wrapped), but its tokenizer is looked for locally only: offline, no
    retries against huggingface.co, one clear line."""
    done = subprocess.run([sys.executable, "-c", HELD_WITHOUT_TOKENIZER], capture_output=True, text=True,
                          cwd=os.getcwd(), env={**os.environ, "PYTHONPATH": os.getcwd()}, timeout=300)
    message, seconds = done.stdout.splitlines()
    assert message.startswith("tokenizer: none given and none found") and "tokenizer=" in message, done.stderr
    assert "huggingface.co" not in done.stderr and float(seconds) < 10


def test_a_device_the_machine_does_not_have():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(GeometryError, match=r"device: 'cuda' asked for, but torch sees no CUDA device"):
        load_model(device="cuda")  # refused before anything loads
    with pytest.raises(GeometryError, match=r"device: 'gpu' is not a torch device"):
        check_device("gpu")
    assert check_device("cpu") == torch.device("cpu")


def test_sequences_longer_than_the_context(model):
    n_ctx = model.cfg.n_ctx
    long_tokens = tm.with_bos(tm.random_tokens(1, n_ctx))
    refused(model, rf"the sequences are {n_ctx + 1} tokens long, more than the model's context n_ctx={n_ctx}",
            lambda: run_with_geometry_hooks(model, long_tokens))
    words = " ".join(tm.WORDS[i % len(tm.WORDS)] for i in range(n_ctx + 5))
    refused(model, rf"text 1 is \d+ tokens long, more than the model's context n_ctx={n_ctx}; cut it into windows",
            lambda: analyze_corpus(model, ["short text", words], progress=False))


def test_empty_strings_are_refused_not_analysed_as_bos(model):
    refused(model, r"text\(s\) \[1\] of 3 are empty strings .*lone BOS token",
            lambda: analyze_corpus(model, [tm.WORDS[0], "", tm.WORDS[1]], progress=False))
    refused(model, r"text\(s\) \[0\] of 1 are empty strings", lambda: run_with_geometry_hooks(model, ""))
