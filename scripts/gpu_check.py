"""The GPU check: the analysis on a CUDA device in float32 and bfloat16 against the CPU float64 reference.

Loads a bundled model (default SmolLM2-135M) on the GPU in each dtype, runs
the default analysis (the rows path), the pattern path and every diagnostic
on each path on a few windows and heads, and a short torchrun of the default
analysis over NCCL; compares every field with the same analysis of a float64
copy of the model on the CPU, within the tolerances it prints; prints the
wall times against the bare forward pass; exits with 1 on any mismatch.
Without CUDA it says so in one line and runs the CPU half (the same runs on
the CPU, the torchrun part with gloo). The logic is
`tl_geometry.runs.device_check`, where the tests import it.

    python scripts/gpu_check.py [--model smollm2-135m] [--device cuda] [--windows 4] [--context 128]
        [--layers 0 15 29] [--heads 0 1] [--no-torchrun]
"""

import sys

from tl_geometry.runs.device_check import main

if __name__ == "__main__":
    sys.exit(main())
