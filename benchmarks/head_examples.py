"""The numbers of docs/reading-a-head.md: an induction head and a previous-token head of SmolLM2-135M.

Runs the default model on sequences of random tokens repeated twice (BOS,
then the same 128 tokens twice), where the last query's induction target is
the token after its first occurrence, and prints, for each example head:
the attention on the target, the effective N (the smallest N whose top-N
attention weights add up to 90 % of the row), and P, R and the chance
levels at a few N. The previous-token head is the head with the largest mean
attention on the key just before each query, over every query.

    python benchmarks/head_examples.py [--sequences 16] [--length 128]
"""

import argparse
import time

import torch

import tl_geometry as tg
from tl_geometry.capture.hook_names import pattern_hook

INDUCTION = (18, 6)
MASS = 0.9


def effective_n(rows: torch.Tensor, mass: float = MASS) -> torch.Tensor:
    """Smallest N whose N largest weights of each row reach ``mass`` of the row, ``[...]``."""
    ordered = rows.sort(dim=-1, descending=True).values.cumsum(-1)
    return (ordered < mass * ordered[..., -1:]).sum(-1) + 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    args = parser.parse_args()
    start = time.perf_counter()
    model = tg.load_model()
    print(f"load_model: {time.perf_counter() - start:.1f} s")
    gen = torch.Generator().manual_seed(0)
    half = torch.randint(1000, 20000, (args.sequences, args.length), generator=gen)
    bos = torch.full((args.sequences, 1), model.tokenizer.bos_token_id)
    tokens = torch.cat([bos, half, half], dim=1)  # [seq, 1 + 2 length]
    last = tokens.shape[1] - 1
    target = last - args.length + 1  # the key after the last token's first occurrence

    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    prev_score = torch.zeros(n_layers, n_heads, dtype=torch.float64)
    last_rows = {}

    def keep(layer):
        def hook(pattern, *, hook):
            p = pattern.double()
            prev_score[layer] = p.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, -1))
            last_rows[layer] = p[:, :, -1, :]  # [seq, head, key]
            return pattern
        return hook

    with torch.no_grad(), model.hooks(fwd_hooks=[(pattern_hook(layer), keep(layer)) for layer in range(n_layers)]):
        model(tokens)
    prev = divmod(int(prev_score[1:].argmax()) + n_heads, n_heads)  # layer 0 left out: it attends to BOS / itself
    print(f"previous-token head: layer {prev[0]}, head {prev[1]} (mean attention on key i-1: "
          f"{prev_score[prev].item():.3f})")

    grid = [1, 2, 3, 4, 8, 16, 32, 64, 128, 256]
    for name, (layer, head) in (("induction", INDUCTION), ("previous-token", prev)):
        rows = last_rows[layer][:, head]  # [seq, key]
        keys = rows.shape[-1]
        eff = effective_n(rows).double()
        result = tg.run_with_geometry_hooks(model, tokens, layers=[layer], heads=[head], n_grid=grid,
                                            diagnostics=["chance"], n_bootstrap=0)
        print(f"\n{name} head L{layer}H{head}: attention of the last query on the induction target "
              f"{rows[:, target].mean():.3f}, on the previous key {rows[:, last - 1].mean():.3f}, "
              f"on BOS {rows[:, 0].mean():.3f}; effective N (90 % of the mass): median "
              f"{eff.median().item():.0f}, range {int(eff.min())}-{int(eff.max())} of {keys} keys")
        print("   N  P(r_max)  chance P  floor N/L  R(r_min)  chance R")
        for n in grid:
            sel = {f: result.sel(f, layer=layer, head=head, n=n).item() for f in
                   ("precision", "chance_precision", "chance_precision_floor", "recall", "chance_recall")}
            print(f"{n:4d}  {sel['precision']:8.3f}  {sel['chance_precision']:8.3f}  {sel['chance_precision_floor']:9.4f}"
                  f"  {sel['recall']:8.3f}  {sel['chance_recall']:8.3f}")


if __name__ == "__main__":
    main()
