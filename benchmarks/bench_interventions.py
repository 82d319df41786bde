"""The cost of top-N interventions, measured side by side in one run.

1. One forward pass with the top-N hook on every layer and head (one N, each
   mode and ranking) against a bare forward pass on the same tokens; rounds
   take turns so that machine load hits all alike. Target (issue "Top-N
   interventions"): at most 1.5x.
2. A layer-scope sweep (every layer, one mode, a small grid, no controls)
   with and without start-at-layer reuse of the clean residual stream.
3. A model-scope sweep with random controls, one setting per forward pass
   against ``--settings-per-pass`` settings stacked along the batch (rounds
   take turns).
4. A model-scope sweep with both modes and random controls on
   ``--cache-grid``, each control's order ranked once for all its N and modes
   (the default) against ranked in every pass (``control_cache_mib=0``).

Run: ``PYTHONPATH=. python benchmarks/bench_interventions.py [--context 256] [--windows 1] [--rounds 3]``.
TransformerBridge supports ``start_at_layer`` from transformer-lens 4;
HookedTransformer (3.x) too.
"""

import argparse
import time

import torch


def timed(fn, rounds: int) -> float:
    """Median wall time of ``fn`` over ``rounds`` calls."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--windows", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=16, help="N of the single intervened pass")
    parser.add_argument("--sweep-grid", default="4,16", help="N grid of the layer-scope sweep")
    parser.add_argument("--sweep-layers", type=int, default=None, help="only the first L layers in the sweep")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--settings-per-pass", type=int, default=4, help="settings stacked per pass in part 3")
    parser.add_argument("--controls", type=int, default=3, help="random controls of the part-3 and part-4 sweeps")
    parser.add_argument("--cache-grid", default="1,4,16,64", help="N grid of the part-4 sweep")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from tl_geometry import default_text, load_model, text_windows
    from tl_geometry.interventions.topn_attention import topn_hooks
    from tl_geometry.interventions.sweep import intervention_sweep, supports_start_at_layer

    model = load_model(progress=False)
    windows = text_windows(model, default_text(), context=args.context, n_windows=args.windows)
    hooks = {f"{mode}/{ranking}": topn_hooks(model, args.n, mode=mode, ranking=ranking)
             for mode in ("renormalise", "delete") for ranking in ("attention", "contribution")}

    def bare():
        with torch.inference_mode():
            model(windows)

    def intervened(key):
        def run():
            with torch.inference_mode(), model.hooks(fwd_hooks=hooks[key]):
                model(windows)
        return run

    bare()  # warm-up
    results = {"bare": [], **{k: [] for k in hooks}}
    for _ in range(args.rounds):  # modes take turns within each round
        results["bare"].append(timed(bare, 1))
        for key in hooks:
            results[key].append(timed(intervened(key), 1))
    base = sorted(results["bare"])[len(results["bare"]) // 2]
    print(f"{model.cfg.model_name}: {args.windows} x {args.context} tokens, N = {args.n}, all {model.cfg.n_layers} "
          f"layers x {model.cfg.n_heads} heads, median of {args.rounds} rounds")
    print(f"  bare forward                  {base:8.3f} s   1.00x")
    for key in hooks:
        t = sorted(results[key])[len(results[key]) // 2]
        print(f"  top-N {key:<24}{t:8.3f} s   {t / base:.2f}x")

    grid = [int(n) for n in args.sweep_grid.split(",")]
    layers = None if args.sweep_layers is None else list(range(args.sweep_layers))
    kwargs = dict(modes=("renormalise",), scope="layer", layers=layers, controls=0, progress=False, n_bootstrap=0)
    plain = timed(lambda: intervention_sweep(model, windows, grid, reuse_residual=False, **kwargs), 1)
    print(f"layer-scope sweep, N = {grid}, {len(layers) if layers else model.cfg.n_layers} layers:")
    print(f"  from the embeddings           {plain:8.3f} s   1.00x")
    if supports_start_at_layer(model):
        reuse = timed(lambda: intervention_sweep(model, windows, grid, reuse_residual=True, **kwargs), 1)
        print(f"  start_at_layer reuse          {reuse:8.3f} s   {reuse / plain:.2f}x")
    else:
        print("  start_at_layer reuse          not supported by this model kind")

    stacked_kwargs = dict(modes=("renormalise",), scope="model", controls=args.controls, progress=False, n_bootstrap=0)
    times = {1: [], args.settings_per_pass: []}
    for _ in range(args.rounds):
        for per_pass in times:
            times[per_pass].append(timed(lambda: intervention_sweep(model, windows, grid, settings_per_pass=per_pass,
                                                                    **stacked_kwargs), 1))
    one = sorted(times[1])[len(times[1]) // 2]
    settings = len(grid) * (1 + args.controls)
    print(f"model-scope sweep, N = {grid}, {args.controls} controls ({settings} settings), median of {args.rounds} rounds:")
    print(f"  one setting per pass          {one:8.3f} s   1.00x")
    many = sorted(times[args.settings_per_pass])[args.rounds // 2]
    print(f"  {args.settings_per_pass} settings per pass          {many:8.3f} s   {many / one:.2f}x")

    cache_grid = [int(n) for n in args.cache_grid.split(",")]
    cache_kwargs = dict(scope="model", controls=args.controls, progress=False, n_bootstrap=0)
    times = {0: [], 1024: []}
    for _ in range(args.rounds):
        for budget in times:
            times[budget].append(timed(lambda: intervention_sweep(model, windows, cache_grid, control_cache_mib=budget,
                                                                  **cache_kwargs), 1))
    every = sorted(times[0])[args.rounds // 2]
    once = sorted(times[1024])[args.rounds // 2]
    settings = 2 * len(cache_grid) * (1 + args.controls)
    print(f"model-scope sweep, both modes, N = {cache_grid}, {args.controls} controls ({settings} settings), "
          f"median of {args.rounds} rounds:")
    print(f"  controls ranked in every pass {every:8.3f} s   1.00x")
    print(f"  each control ranked once      {once:8.3f} s   {once / every:.2f}x")


if __name__ == "__main__":
    main()
