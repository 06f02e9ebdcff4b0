# The two commands that matter: `make demo` and `make test`. Both set everything up
# on a fresh clone (a .venv with torch 2.13.0 CPU, the test deps, the C++ core).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
CORE_SOURCES := $(wildcard csrc/*.cpp csrc/*.h) setup.py pyproject.toml

.PHONY: all setup demo test lint test-long test-isa bench bench-real-size sweep-xla torchneuron-suite clean

all: test

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch (the CPU wheel on local disk), numpy (which `import torch` loads if present) and the build
# tools first; then two jobs at once: the test deps download and unpack while the core compiles
# against that torch. Packages are byte-compiled at install (no --no-compile): where
# PYTHONDONTWRITEBYTECODE is set, nothing else would write the .pyc files, and every process of
# the test run would compile torch's modules from source again.
$(VENV)/.torch: | $(PY)
	$(PIP) install torch==2.13.0 numpy "setuptools>=64" wheel ninja
	touch $@

# torch named again so that this resolver keeps it exactly as installed.
$(VENV)/.deps: pyproject.toml requirements-test.txt $(VENV)/.torch
	$(PIP) install torch==2.13.0 -r requirements-test.txt
	touch $@

# The core is compiled against the installed torch (no build isolation).
$(VENV)/.core: $(VENV)/.torch $(CORE_SOURCES)
	$(PIP) install --no-build-isolation --no-deps -e .
	touch $@

setup:
	$(MAKE) --no-print-directory -j2 $(VENV)/.deps $(VENV)/.core

# `make demo DEMO_ARGS="--model real-size-random --height 64 --width 64 --steps 1"`: the real size (16 GB).
DEMO_ARGS ?=
demo: setup
	$(PY) -m torch_neuronx.demo $(DEMO_ARGS)

# One worker per core, each taking whole files (module fixtures, such as a shared compile
# cache, stay in one process).
test: setup lint
	$(PY) -m pytest -q -n auto --dist loadfile -m "not long"

# ruff, with the rules in pyproject.toml (make test runs it first; CI through make test).
lint: setup
	$(VENV)/bin/ruff check torch_neuronx torch_neuronx_pytest tests benchmarks examples .ci

# The tests marked long (training under the xla executor, the newest stand-ins under it, the seed's
# main job compiled, 20 short processes, diffusers tensor parallel, compiler crashes: minutes of
# compiling and subprocesses);
# CI runs them too; the slowest are listed, as CI has 90 minutes in all.
test-long: setup
	$(PY) -m pytest -q -n auto --dist loadfile -m long --durations=15

# The tests whose results come from Inductor's generated code, again under a forced vector ISA
# (ATEN_CPU_CAPABILITY=avx2 or default: what CI machines without AVX-512 run): `make test-isa ISA=avx2`.
ISA ?= avx2
COMPILED_TESTS := $(wildcard tests/test_compile*.py) tests/test_seed_examples_compiled.py tests/test_training.py
test-isa: setup
	ATEN_CPU_CAPABILITY=$(ISA) $(PY) -m pytest -q -n auto --dist loadfile $(COMPILED_TESTS) --durations=15

BENCH_OUT := benchmarks/results

# The faithful compiler over every op_db op and module_db module, in two processes (long: about an
# hour on 2 cores with a cold NEFF cache, minutes with a warm one); writes docs/xla-sweep.md. A
# representative part runs in `make test` (tests/test_xla_sweep.py).
sweep-xla: setup
	mkdir -p $(BENCH_OUT)
	$(PY) tests/helpers/xla_sweep.py --shard 0/2 --json $(BENCH_OUT)/xla-sweep-0.json & first=$$!; \
	$(PY) tests/helpers/xla_sweep.py --shard 1/2 --json $(BENCH_OUT)/xla-sweep-1.json && wait $$first
	$(PY) tests/helpers/xla_sweep.py --from-json $(BENCH_OUT)/xla-sweep-0.json $(BENCH_OUT)/xla-sweep-1.json \
		--json $(BENCH_OUT)/xla-sweep.json --markdown docs/xla-sweep.md

# TorchNeuron's own test suite against this package (TORCHNEURON: a checkout of its public repository,
# a work tree or a bare git directory; never copied here). Writes $(BENCH_OUT)/torchneuron-suite/.
TORCHNEURON ?=
torchneuron-suite: setup
	@test -n "$(TORCHNEURON)" || { echo "set TORCHNEURON=<a checkout of TorchNeuron's repository>"; exit 2; }
	$(PY) tests/helpers/torchneuron_suite.py --checkout "$(TORCHNEURON)" --out $(BENCH_OUT)/torchneuron-suite

# Each script writes its numbers to $(BENCH_OUT); the last line prints every target in one table.
bench: setup
	mkdir -p $(BENCH_OUT)
	$(PY) benchmarks/bench_eager.py --json $(BENCH_OUT)/eager.json
	$(PY) benchmarks/bench_compile.py --json $(BENCH_OUT)/compile.json
	$(PY) benchmarks/bench_compile_cache.py --json $(BENCH_OUT)/compile_cache.json
	$(PY) benchmarks/bench_distributed.py --json $(BENCH_OUT)/distributed.json
	$(PY) benchmarks/bench_pipeline.py --json $(BENCH_OUT)/pipeline.json
	$(PY) benchmarks/bench_diagnostics.py --json $(BENCH_OUT)/diagnostics.json
	$(PY) benchmarks/bench_xla.py --json $(BENCH_OUT)/xla.json
	$(PY) benchmarks/bench_simulate.py --json $(BENCH_OUT)/simulate.json
	$(PY) benchmarks/bench_pytest_plugin.py --json $(BENCH_OUT)/pytest_plugin.json
	$(PY) benchmarks/targets.py $(BENCH_OUT)/*.json

# FLUX.2-klein-4B at its real size (random weights; needs 17 GB of host memory and about an hour).
bench-real-size: setup
	mkdir -p $(BENCH_OUT)
	$(PY) benchmarks/bench_real_size.py --json $(BENCH_OUT)/real-size.json

clean:
	rm -rf build *.egg-info torch_neuronx/_C*.so $(VENV)
