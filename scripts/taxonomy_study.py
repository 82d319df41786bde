"""The numbers behind docs/circuits.md: regimes by depth, threshold sensitivity, and detect_head heads.

Run from the repository root (about a minute per model on a laptop CPU; the
Gemma-3-270M part needs its package and about 6 GB):

    python scripts/taxonomy_study.py [smollm2-135m] [gemma3-270m]

For each model: 16 windows of 512 tokens of the bundled text, the
``"taxonomy"`` diagnostic, then

- the label counts by layer (the rules of `tl_geometry.analysis.taxonomy`);
- the sensitivity table (`threshold_sensitivity`, +-10 %);
- TransformerLens's ``detect_head`` scores for previous-token, duplicate-token
  and induction heads on a prompt of 50 random single-token words repeated
  twice (BOS first), and the regimes of the heads scoring above 0.4.
"""

import os
import sys
from pathlib import Path

import numpy as np
import torch

import tl_geometry as tg
from tl_geometry.analysis.taxonomy import REASONS, REGIMES

N_WINDOWS, CONTEXT, DETECTED = 16, 512, 0.4


def repeated_random_prompt(model, length: int = 50, seed: int = 0) -> str:
    """BOS + the same random single-token words twice, as a string that tokenises back to exactly that."""
    rng = np.random.default_rng(seed)
    chosen: list[int] = []
    while len(chosen) < length:
        token = int(rng.integers(1000, model.tokenizer.vocab_size))
        piece = model.tokenizer.decode([token])
        if piece.startswith(" ") and piece[1:].isalpha() and token not in chosen:
            chosen.append(token)
    text = model.tokenizer.decode(chosen) * 2
    if model.to_tokens(text)[0].tolist()[1:] != chosen + chosen:
        raise RuntimeError("the repeated prompt does not round-trip through the tokenizer")
    return text


def head_scores(model, text: str) -> dict[str, torch.Tensor]:
    """detect_head's three built-in scores, [layer, head]."""
    from transformer_lens.head_detector import detect_head

    names = ("previous_token_head", "duplicate_token_head", "induction_head")
    return {name: detect_head(model, text, name) for name in names}


def main(names: list[str]) -> None:
    for name in names:
        model = tg.load_model(name, progress=False)
        windows = tg.text_windows(model, tg.default_text(), context=CONTEXT, n_windows=N_WINDOWS)
        result = tg.analyze_corpus(model, windows, batch_size=4, progress=False, diagnostics=["taxonomy"])
        if os.environ.get("STUDY_SAVE"):  # keep the result, to look again without the forward passes
            result.save(Path(os.environ["STUDY_SAVE"]) / name)
        found = tg.classify_heads(result)
        print(f"## {name}: {result.n_sequences} windows x {CONTEXT} tokens, {len(found.layers)} x {len(found.heads)} heads")
        counts = found.counts_by_layer()
        print("layer | " + " | ".join(REGIMES))
        for layer, row in zip(found.layers, counts.tolist()):
            print(f"{layer} | " + " | ".join(map(str, row)))
        print("total | " + " | ".join(map(str, counts.sum(0).tolist())))
        reasons = torch.bincount(found.reason.flatten(), minlength=len(REASONS)).tolist()
        print("reasons:", dict(zip(REASONS, reasons)))
        print(f"low confidence (< {found.config.min_confidence}):", int(found.low_confidence.sum()),
              "; median confidence", float(found.confidence.nanmedian()))
        print("threshold | value | labels changed | counts " + str(REGIMES))
        for row in tg.threshold_sensitivity(result):
            print(f"{row.threshold} | {row.value:g} | {row.changed} | {row.counts}")
        scores = head_scores(model, repeated_random_prompt(model))
        print(f"detect_head heads (score > {DETECTED}) by regime " + str(REGIMES))
        for kind, score in scores.items():
            chosen = score > DETECTED
            table = torch.bincount(found.labels[chosen], minlength=len(REGIMES)).tolist()
            top = score.flatten().topk(5)
            strongest = [(divmod(int(i), score.shape[1]), REGIMES[int(found.labels.flatten()[i])]) for i in top.indices]
            print(f"{kind}: {int(chosen.sum())} heads -> {table}; strongest five: {strongest}")
        del model, result
        print()


if __name__ == "__main__":
    main(sys.argv[1:] or ["smollm2-135m", "gemma3-270m"])
