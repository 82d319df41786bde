"""Tiny random TransformerLens models built offline, in milliseconds, one per kind.

Nothing here touches the Hugging Face hub: configs, weights and the tokenizer
are built in code. Weights are drawn with a large initialiser range so that
attention patterns are far from uniform (ties and near-ties would make the
count-based metrics fragile), and the models run in float64 so that batched
and one-at-a-time passes agree to rounding.

Kinds:
    "hooked"      HookedTransformer, rotary + GQA (transformer-lens 3.x only)
    "bridge-gpt2" TransformerBridge over a GPT-2 (learned positions, MHA)
    "bridge-llama" TransformerBridge over a Llama (rotary, 4 query heads, 2 KV heads)
    "compat-llama" the same bridge after ``enable_compatibility_mode()``
"""

import importlib.metadata
from typing import Any

import torch

WORDS = (
    "the a cat dog sat on mat and ran big small red blue green one two three four five six "
    "seven eight nine ten house tree bird fish sun moon star sky sea"
).split()
BOS_ID, PAD_ID, UNK_ID = 0, 1, 2
VOCAB_SIZE = 64
N_LAYERS, D_MODEL, N_HEADS, N_KV_HEADS, N_CTX = 2, 32, 4, 2, 64

KINDS = ("hooked", "bridge-gpt2", "bridge-llama", "compat-llama")


def tl_major_version() -> int:
    """Major version of the installed transformer-lens."""
    return int(importlib.metadata.version("transformer-lens").split(".")[0])


def has_hooked_transformer() -> bool:
    """True where ``HookedTransformer`` exists (transformer-lens 3.x and earlier)."""
    try:
        from transformer_lens import HookedTransformer  # noqa: F401
    except ImportError:
        return False
    return True


def tiny_tokenizer() -> Any:
    """A word-level tokenizer with BOS (id 0) and PAD (id 1), built in code."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<bos>": BOS_ID, "<pad>": PAD_ID, "<unk>": UNK_ID}
    vocab.update({w: i + 3 for i, w in enumerate(WORDS)})
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    # add_bos_token and name_or_path keep TransformerLens from re-loading the
    # tokenizer from the hub to switch BOS on.
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<bos>",
        eos_token="<bos>",
        pad_token="<pad>",
        unk_token="<unk>",
        add_bos_token=True,
        name_or_path="tiny-word-level",
    )


def sharpen(model: torch.nn.Module, seed: int, scale: float) -> None:
    """Redraw every weight matrix with a wide normal so attention is peaked."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * scale)


def tiny_bridge(arch: str = "llama", *, compat: bool = False, seed: int = 0, dtype: torch.dtype = torch.float64,
                n_layers: int = N_LAYERS) -> Any:
    """A TransformerBridge over a tiny random GPT-2 (``"gpt2"``) or Llama with GQA (``"llama"``), ``n_layers`` deep."""
    import transformers
    from transformer_lens.model_bridge import TransformerBridge

    common = dict(vocab_size=VOCAB_SIZE, bos_token_id=BOS_ID, eos_token_id=BOS_ID, pad_token_id=PAD_ID)
    if arch == "llama":
        config = transformers.LlamaConfig(
            hidden_size=D_MODEL,
            intermediate_size=2 * D_MODEL,
            num_hidden_layers=n_layers,
            num_attention_heads=N_HEADS,
            num_key_value_heads=N_KV_HEADS,
            max_position_embeddings=N_CTX,
            **common,
        )
    elif arch == "gpt2":
        config = transformers.GPT2Config(
            n_embd=D_MODEL, n_layer=n_layers, n_head=N_HEADS, n_positions=N_CTX, **common
        )
    else:
        raise ValueError(f"arch: expected 'llama' or 'gpt2', got {arch!r}")
    torch.manual_seed(seed)
    hf_model = transformers.AutoModelForCausalLM.from_config(config).to(dtype).eval()
    sharpen(hf_model, seed, 0.3)
    bridge = TransformerBridge.boot_transformers(
        f"tiny-{arch}", hf_model=hf_model, tokenizer=tiny_tokenizer(), dtype=dtype
    )
    if compat:
        bridge.enable_compatibility_mode()
    # A bridge's first forward adds one hook to each LayerNorm of the wrapped model and keeps it (TransformerLens
    # 3.9 and 4.3): run it once, so that a test counting hooks starts from the model as a user has it.
    with torch.no_grad():
        bridge(torch.tensor([[BOS_ID]]))
    return bridge.eval()


def tiny_hooked(*, seed: int = 0, dtype: torch.dtype = torch.float64) -> Any:
    """A HookedTransformer with rotary positions and GQA (transformer-lens 3.x only)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=N_LAYERS,
        d_model=D_MODEL,
        n_ctx=N_CTX,
        d_head=D_MODEL // N_HEADS,
        n_heads=N_HEADS,
        n_key_value_heads=N_KV_HEADS,
        d_vocab=VOCAB_SIZE,
        act_fn="gelu",
        positional_embedding_type="rotary",
        normalization_type="LN",
        default_prepend_bos=True,
        seed=seed,
        dtype=dtype,
        model_name="tiny-hooked",
    )
    model = HookedTransformer(cfg, tokenizer=tiny_tokenizer())
    sharpen(model, seed, 0.3)
    return model.eval()


def make_model(kind: str, **kwargs: Any) -> Any:
    """The tiny model of one kind of ``KINDS``."""
    if kind == "hooked":
        return tiny_hooked(**kwargs)
    if kind == "bridge-gpt2":
        return tiny_bridge("gpt2", **kwargs)
    if kind == "bridge-llama":
        return tiny_bridge("llama", **kwargs)
    if kind == "compat-llama":
        return tiny_bridge("llama", compat=True, **kwargs)
    raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")


def random_tokens(n_seq: int, length: int, seed: int = 0) -> torch.Tensor:
    """Random content tokens (no BOS, PAD or UNK), ``[n_seq, length]``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, 3 + len(WORDS), (n_seq, length), generator=gen)


def with_bos(tokens: torch.Tensor) -> torch.Tensor:
    """Prepend the BOS token to every row."""
    return torch.cat([torch.full((tokens.shape[0], 1), BOS_ID, dtype=tokens.dtype), tokens], dim=1)


def left_padded(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of different lengths left-padded with PAD into one ``[batch, pos]`` tensor, and its attention mask."""
    width = max(len(r) for r in rows)
    tokens = torch.full((len(rows), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros_like(tokens)
    for i, r in enumerate(rows):
        tokens[i, width - len(r) :] = r
        mask[i, width - len(r) :] = 1
    return tokens, mask


def hook_counts(model: torch.nn.Module) -> dict[str, int]:
    """Number of forward/backward hooks on every submodule (HookPoint or not), by name."""
    counts = {}
    for name, module in model.named_modules():
        n = len(module._forward_hooks) + len(module._forward_pre_hooks) + len(module._backward_hooks)
        n += len(getattr(module, "fwd_hooks", ()) or ()) + len(getattr(module, "bwd_hooks", ()) or ())
        counts[name] = n
    return counts


def tiny_window_bridge(arch: str, *, compat: bool):
    """A TransformerBridge over a tiny random Gemma-3 (window 4 on layers 0 and 2) or Mistral (window 3)."""
    import transformers
    from transformer_lens.model_bridge import TransformerBridge

    common = dict(
        vocab_size=VOCAB_SIZE, bos_token_id=BOS_ID, eos_token_id=BOS_ID, pad_token_id=PAD_ID,
        hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    if arch == "gemma3":
        layer_types = ["sliding_attention", "full_attention", "sliding_attention"]
        config = transformers.Gemma3TextConfig(
            num_hidden_layers=3, head_dim=8, sliding_window=4, layer_types=layer_types,
            architectures=["Gemma3ForCausalLM"], **common,
        )  # fmt: skip
    else:
        config = transformers.MistralConfig(
            num_hidden_layers=2, sliding_window=3, architectures=["MistralForCausalLM"], **common
        )
    torch.manual_seed(0)
    hf_model = transformers.AutoModelForCausalLM.from_config(config).eval()
    bridge = TransformerBridge.boot_transformers(f"tiny-{arch}", hf_model=hf_model, tokenizer=tiny_tokenizer())
    if compat:
        bridge.enable_compatibility_mode(disable_warnings=True)
    return bridge.eval()


# transformers' eager Llama attention takes its softmax in float32 even in a float64 model, and float32 sums
# can depend on a row's padded length (they do on some CPUs and not on others). The same documents padded
# differently (another batch, another process) then agree to ~1e-6 relative in every continuous quantity,
# ~1e-6 absolute in a difference of two NLLs; counts, and so Precision and Recall, stay exact.
PADDING_CLOSE = {"rtol": 2e-5, "atol": 1e-5}


def padding_close(model: Any) -> dict[str, float]:
    """Tolerances for comparing runs of ``model`` on differently padded batches: `PADDING_CLOSE` for a Llama
    bridge, else none (torch.testing's defaults: float64 models agree to rounding)."""
    return dict(PADDING_CLOSE) if getattr(model.cfg, "architecture", None) == "LlamaForCausalLM" else {}


ARCHITECTURES = ("gpt2", "neox", "gptj", "llama", "mistral", "qwen2", "gemma2", "gemma3", "bloom")


def tiny_arch_model(arch: str) -> Any:
    """A tiny random Hugging Face causal LM of one architecture of `ARCHITECTURES` (the zoo), float64, eval mode."""
    import transformers

    ids = dict(vocab_size=VOCAB_SIZE, bos_token_id=BOS_ID, eos_token_id=BOS_ID, pad_token_id=PAD_ID)
    rotary = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=64, num_hidden_layers=3, **ids)  # fmt: skip
    configs = {
        "gpt2": lambda: transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, **ids),
        "neox": lambda: transformers.GPTNeoXConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                   num_attention_heads=4, max_position_embeddings=64, **ids),
        "gptj": lambda: transformers.GPTJConfig(n_embd=32, n_layer=2, n_head=4, n_positions=64, rotary_dim=4, **ids),
        "llama": lambda: transformers.LlamaConfig(**rotary),
        "mistral": lambda: transformers.MistralConfig(sliding_window=3, **rotary),
        "qwen2": lambda: transformers.Qwen2Config(**rotary),
        "gemma2": lambda: transformers.Gemma2Config(head_dim=8, sliding_window=4, attn_logit_softcapping=5.0,
                                                    query_pre_attn_scalar=8, **rotary),
        "gemma3": lambda: transformers.Gemma3TextConfig(head_dim=8, sliding_window=4,
                                                        layer_types=["sliding_attention", "full_attention",
                                                                     "sliding_attention"], **rotary),
        "bloom": lambda: transformers.BloomConfig(hidden_size=32, n_layer=2, n_head=4, **ids),
    }  # fmt: skip
    torch.manual_seed(0)
    config = configs[arch]()
    config.architectures = [transformers.AutoModelForCausalLM._model_mapping[type(config)].__name__]
    hf_model = transformers.AutoModelForCausalLM.from_config(config).to(torch.float64).eval()
    sharpen(hf_model, 0, 0.2)
    return hf_model
