PYTHON ?= python3
# Test processes (pytest-xdist): the suite mostly waits (servers, subprocesses, clusters,
# rate limits), so 6 on 2 cores (a clean clone on a quiet machine: 4 took 6:35, 6 took 5:39,
# 8 took 6:27, its processes then competing for the cpus). Tests sharing an expensive session fixture (one engine
# variant of the conformance suite, the Dask session cluster) share an xdist_group: one
# worker runs the group, in the order tests/conftest.py sorts them (--no-loadscope-reorder).
JOBS ?= 6
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench peers clean

PACKAGES := -e ".[test]" -e engines/dask -e "engines/daft[ray]"

# uv installs the same packages as pip (same resolution) in ~10 s where pip takes ~50 s (a
# clean clone, 1.1 GB of wheels, 2 cores); pip does it when uv cannot be had or fails
$(STAMP): pyproject.toml engines/dask/pyproject.toml engines/daft/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	( $(PY) -m pip install -q uv && $(VENV)/bin/uv pip install -q --python $(PY) $(PACKAGES) ) \
	  || $(PY) -m pip install -q $(PACKAGES)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) examples/enrich.py --rows 2000

# PYTHONDONTWRITEBYTECODE (set in some shells) would make every process of the run (xdist
# workers, Dask workers, the tests' child interpreters: hundreds) compile the project's
# modules and rewrite the tests anew: ~0.1-0.2 CPU s each
test: $(STAMP)
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -p no:cacheprovider -n $(JOBS) --dist loadgroup --no-loadscope-reorder --reruns 1 $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check hypernodes_dist hypernodes_bench engines tests benchmarks examples
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(VENV)/bin/hypernodes-dist bench --engines local,dask,daft --items 1000,100000

peers: $(STAMP)
	$(PY) benchmarks/peers.py --setup
	$(PY) benchmarks/peers.py

clean:
	rm -rf $(VENV) .cache build *.egg-info
