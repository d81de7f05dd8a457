# The README's commands. Every target sets up its own virtual environment first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench docs docs-serve clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/attnlab train

# The suite on every core (pytest-xdist; one test file per worker at a time, so a file's
# fixtures are built once); `$(BIN)/python -m pytest tests/x` runs part of it in one process.
test: $(STAMP)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(BIN)/python -m pytest -n auto --dist loadgroup

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

# `make bench BENCH_ARGS=--quick` for a shorter run (see benchmarks/run_all.py --help)
bench: $(STAMP)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(BIN)/python benchmarks/run_all.py $(BENCH_ARGS)

# The documentation site (mkdocs.yml) into site/; a warning (a broken link, a page missing from
# the nav, a failing code block that the build runs) is an error.
docs: $(STAMP)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg NO_MKDOCS_2_WARNING=1 \
		$(BIN)/mkdocs build --strict --site-dir site

# The site at http://127.0.0.1:8000, rebuilt as pages change. `make docs` output opens from
# disk too (site/index.html), where search needs one script from unpkg.com; served, it needs
# no network at all.
docs-serve: $(STAMP)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg NO_MKDOCS_2_WARNING=1 \
		$(BIN)/mkdocs serve

clean:
	rm -rf $(VENV) runs site build dist *.egg-info src/*.egg-info .pytest_cache .ruff_cache
