"""A bundled model with its decoder layers offloaded (CPU and disk, through accelerate) against the same model
loaded whole, side by side in one run: how far apart every field is, and what the offload costs in time.

Both models are loaded as `load_model` loads an offloaded one (the compatibility layer without weight
processing, which TransformerLens 4 cannot apply to offloaded weights). For each capture path (rows,
pattern) it runs every diagnostic on ``--windows`` windows of ``--context`` tokens of the default text, then
prints per field the largest absolute and relative difference of the per-head means and whether the defined
counts are equal, and the median wall time of each model's run (the two take turns) with their ratio.

With ``interventions`` among ``--parts`` it also runs a top-N sweep (layer by layer on ``--layers``, from the
clean residual, N = 1, 4, 16, both modes, one random control) on both models and prints the largest difference
of any of its statistics and the two wall times.

    python benchmarks/bench_device_map.py [--model smollm2-135m] [--context 64] [--windows 2] [--repeats 3]
        [--layers 0,1] [--parts analysis interventions]
"""

import argparse
import statistics
import time

import torch


def _offloading_map(model) -> dict[str, str]:
    """Every other decoder layer to disk, the rest of the model to the CPU (accelerate offloads both)."""
    hf = model.original_model
    base = hf.base_model_prefix
    device_map = {name: "cpu" for name, _ in hf.named_children() if name != base}
    device_map |= {f"{base}.{name}": "cpu" for name, _ in getattr(hf, base).named_children() if name != "layers"}
    device_map |= {f"{base}.layers.{layer}": "disk" if layer % 2 else "cpu" for layer in range(model.cfg.n_layers)}
    return device_map


def _differences(a, b) -> list[tuple[str, bool, float, float]]:
    """Per field: counts equal, largest absolute and relative difference of the per-head means (NaN matched)."""
    rows = []
    for name in a.fields:
        x, y = a.per_head(name).double(), b.per_head(name).double()
        both = torch.isfinite(x) & torch.isfinite(y)
        same_missing = bool(torch.equal(torch.isfinite(x), torch.isfinite(y)))
        diff = (x - y).abs()[both]
        rel = (diff / y.abs()[both].clamp(min=1e-30)) if diff.numel() else diff
        rows.append((name, bool(torch.equal(a.count(name), b.count(name))) and same_missing,
                     float(diff.max()) if diff.numel() else 0.0, float(rel.max()) if rel.numel() else 0.0))
    return rows


def _sweep_differences(a, b) -> tuple[float, int, int]:
    """Largest absolute difference over every statistic of two sweeps (NaN matched), the number of statistics
    and how many are bit-identical."""
    worst, same, total = 0.0, 0, 0
    for name, stats in a.stats.items():
        for statistic, x in stats.stored().arrays().items():
            y = b.stats[name].stored().arrays()[statistic]
            x, y = x.double(), y.double()
            total += 1
            if torch.equal(torch.isnan(x), torch.isnan(y)) and torch.equal(x.nan_to_num(), y.nan_to_num()):
                same += 1
                continue
            both = ~(torch.isnan(x) | torch.isnan(y))
            worst = max(worst, float((x - y).abs()[both].max()) if both.any() else float("inf"))
    return worst, total, same


def _interventions(whole, split, tokens, layers: list[int], repeats: int) -> None:
    from tl_geometry.interventions import intervention_sweep

    sweep = {"scope": "layer", "layers": layers, "controls": 1, "n_bootstrap": 4, "progress": False}
    run = {name: (lambda m=m: intervention_sweep(m, tokens, [1, 4, 16], **sweep)) for name, m in
           (("whole", whole), ("offloaded", split))}
    times: dict[str, list[float]] = {name: [] for name in run}
    results = {}
    for _ in range(repeats):
        for name, fn in run.items():
            start = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - start)
    worst, total, same = _sweep_differences(results["offloaded"], results["whole"])
    median = {name: statistics.median(t) for name, t in times.items()}
    print(f"\ninterventions (layer scope, layers {layers}, N = 1, 4, 16, both modes, 1 control): {total} statistics, "
          f"bit-identical {same}, largest |difference| {worst:.3g}")
    print(f"  wall time (median of {repeats}): whole {median['whole']:.2f} s, offloaded {median['offloaded']:.2f} s, "
          f"ratio {median['offloaded'] / median['whole']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layers", default="0,1", help="layers analysed (default 0,1: one offloaded to the CPU, "
                        "one to disk); every layer runs either way")
    parser.add_argument("--parts", nargs="+", choices=("analysis", "interventions"), default=["analysis"])
    args = parser.parse_args()

    from tl_geometry import GeometryConfig, run_with_geometry_hooks
    from tl_geometry.corpus_input.token_windows import text_windows
    from tl_geometry.models import load_model
    from tl_geometry.corpus_input.plain_text import default_text

    whole = load_model(args.model, progress=False, compatibility_mode=False)
    whole.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    split = load_model(args.model, progress=False, device_map=_offloading_map(whole))
    tokens = text_windows(whole, default_text(), context=args.context, n_windows=args.windows)
    print(f"{args.model}: {args.windows} x {args.context} tokens, every diagnostic on layers {args.layers}; offloaded: "
          f"{sorted(set(split.original_model.hf_device_map.values()))} ({split.cfg.n_devices} places)")
    layers = [int(layer) for layer in args.layers.split(",")]
    if "interventions" in args.parts:
        _interventions(whole, split, tokens, layers, args.repeats)
    for capture in ("rows", "pattern") if "analysis" in args.parts else ():
        config = GeometryConfig(diagnostics="all", n_bootstrap=4, capture=capture,
                                layers=layers)
        run = {name: (lambda m=m: run_with_geometry_hooks(m, tokens, config=config)) for name, m in
               (("whole", whole), ("offloaded", split))}
        results = {name: fn() for name, fn in run.items()}
        times: dict[str, list[float]] = {name: [] for name in run}
        for _ in range(args.repeats):
            for name, fn in run.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        median = {name: statistics.median(t) for name, t in times.items()}
        rows = _differences(results["offloaded"], results["whole"])
        worst_abs = max(rows, key=lambda r: r[2])
        worst_rel = max(rows, key=lambda r: r[3])
        print(f"\ncapture={capture}: {len(rows)} fields; counts and missing values equal in "
              f"{sum(r[1] for r in rows)}; largest |difference| {worst_abs[2]:.3g} ({worst_abs[0]}), largest "
              f"relative {worst_rel[3]:.3g} ({worst_rel[0]}); fields bit-identical: "
              f"{sum(r[2] == 0 for r in rows)}")
        print(f"  wall time (median of {args.repeats}): whole {median['whole']:.2f} s, offloaded "
              f"{median['offloaded']:.2f} s, ratio {median['offloaded'] / median['whole']:.2f}")


if __name__ == "__main__":
    main()
