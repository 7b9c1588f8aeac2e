# dalign: build the book, run the tests, run the benchmarks.
#
#   make book                 set up .venv, execute the notebooks (PROFILE=cpu), build the HTML book
#   make test                 set up .venv, run the library tests and every notebook at PROFILE=smoke
#   make serve                preview the built book at http://localhost:8000/ (PORT=...)
#   make publish              push the built book to the gh-pages branch (ghp-import; GitHub Pages serves it)
#   make help                 list the targets
#
# Everything runs through .venv/bin/python, so no shell needs to be activated.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:

PROFILE ?= cpu
# The same list as dalign_repro.config.PROFILES (tests/test_notebooks.py checks that they agree).
PROFILES := smoke lab cpu gpu paper
ifneq ($(words $(PROFILE)),1)
$(error PROFILE='$(PROFILE)' must be exactly one of: $(PROFILES))
endif
ifeq ($(filter $(PROFILE),$(PROFILES)),)
$(error PROFILE='$(PROFILE)' is not a known profile; choose one of: $(PROFILES))
endif

# The interpreter used to create .venv (override: make PYTHON_BOOT=/path/to/python3.11 ...).
PYTHON_BOOT ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.dalign-installed
# The benchmarks' interpreter: .venv-bench (make bench-env: the project's venv plus the capture's peers,
# BackPACK and Opacus, which the project itself does not depend on) where it exists, else the project's.
BENCH_VENV := .venv-bench
BENCH_PY = $(if $(wildcard $(BENCH_VENV)/bin/python),$(BENCH_VENV)/bin/python,$(PY))
# jupyter-book 1.x has no `python -m jupyter_book`; call its CLI entry point through the venv's python.
JB := $(PY) -c 'import sys; from jupyter_book.cli.main import main; sys.argv[0] = "jupyter-book"; sys.exit(main())'

space := $() $()
ONLY ?=
FORCE ?=
# Overrides of the profile's config for the notebooks run, each value a TOML value, e.g.
# SET='seeds=2 widths=[32, 64]' (with ONLY=...: each chapter's config must have the fields). Their results go to
# results/<profile>+<hash>/.
SET ?=
# Chapters executed at once (scripts/execute_notebooks.py --jobs: each in its own worker, a chapter after those whose
# results it reads); the book's machine has 2 cores. JOBS=1: one after the other.
JOBS ?= 2
# STRICT=1: make book fails when the chapters were not all executed at one profile (default: each says so).
STRICT ?=
PYTEST_ARGS ?=
# make test: pytest-xdist workers (one test file per worker at a time; 0 runs in one process).
TEST_WORKERS ?= auto
BENCH_OUT ?= results/bench
# make bench QUICK=1: every benchmark that has a --quick gets it (seconds to a minute each, for CI).
QUICK ?=
DATA_DIR ?=
# make serve: the port of the local preview (http://localhost:$(PORT)/).
PORT ?= 8000
BOOK_HTML := book/_build/html
# The repository's https address for the book's repository link and launch buttons (book/_ext/dalign_publish.py):
# by default the `origin` remote's; empty: no buttons.
REPO_URL ?= $(shell git config --get remote.origin.url 2>/dev/null)
export DALIGN_REPOSITORY_URL := $(REPO_URL)
# make publish: the branch and remote that serve the book (GitHub Pages: gh-pages of origin).
PAGES_BRANCH ?= gh-pages
PAGES_REMOTE ?= origin
# One build at a time per folder: a second `make book` (or `make notebooks`) here stops with a message
# instead of overwriting the first one's chapters (scripts/build_lock.py).
LOCK := $(PY) scripts/build_lock.py book/_build/.build.lock --

# Headless plotting for scripts, tests and benchmarks (notebook kernels get the inline backend
# from scripts/execute_notebooks.py, so figures land in the executed notebooks).
export MPLBACKEND := Agg
# The data cache (tokenizers, corpora, downloads) of make's runs stays in the repository (make distclean
# removes it); outside make the library uses $$DALIGN_CACHE or the user's cache folder.
export DALIGN_CACHE ?= $(CURDIR)/.cache/dalign
# Tests never reach a model hub: tests/conftest.py sets the offline variables for them.

.PHONY: help setup data book notebooks serve publish test bench bench-env clean distclean

help: ## list the targets
	@echo "dalign make targets (PROFILE=$(PROFILE); choose one of: $(PROFILES))"
	@echo
	@grep -E '^[a-z][a-zA-Z_-]*:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([^:]+):.*## (.*)$$/\1\t\2/' | \
		awk -F'\t' '{ printf "  make %-10s %s\n", $$1, $$2 }'
	@echo
	@echo "Variables: PROFILE=$(subst $(space),|,$(PROFILES)) (default cpu)  ONLY=<notebook stem>  FORCE=1|0"
	@echo "           SET='field=value ...' (overrides, TOML values: SET='seeds=2 widths=[32, 64]'; results in results/<profile>+<hash>)"
	@echo "           STRICT=1 (make book refuses chapters executed at different profiles)  JOBS=2 (chapters at once)"
	@echo "           PYTEST_ARGS='...'  BENCH_OUT=results/bench  PYTHON_BOOT=python3.11  PORT=8000 (make serve)"
	@echo "           DATA_DIR=<folder with CIFAR archives or Fashion-MNIST files you already have> (make data)"
	@echo "           REPO_URL=https://github.com/<owner>/<name> (the book's repository link and launch buttons)"
	@echo "           PAGES_BRANCH=gh-pages PAGES_REMOTE=origin (make publish)"

setup: $(STAMP) ## create .venv and install requirements.txt plus dalign_core (reruns only when those files change)

$(PY):
	@command -v $(PYTHON_BOOT) >/dev/null 2>&1 || { \
		echo "error: $(PYTHON_BOOT) not found; install Python 3.11 or run make PYTHON_BOOT=/path/to/python3.11" >&2; exit 1; }
	$(PYTHON_BOOT) -m venv $(VENV)

$(STAMP): requirements.txt pyproject.toml | $(PY)
	$(PY) -m pip install -r requirements.txt
	$(PY) -m pip install --no-deps -e .
	@touch $@

data: $(STAMP) ## fetch and verify the data PROFILE needs (smoke: synthetic images; gpu/paper: CIFAR too; DATA_DIR)
	$(PY) scripts/fetch_data.py --profile $(PROFILE) $(if $(DATA_DIR),--root $(DATA_DIR))

notebooks: $(STAMP) ## execute notebooks/NN_*.ipynb with papermill into book/chapters/ (PROFILE, ONLY, FORCE, SET, JOBS)
	$(LOCK) $(PY) scripts/execute_notebooks.py --profile $(PROFILE) $(foreach name,$(ONLY),--only $(name)) \
		--force='$(subst ','\'',$(strip $(FORCE)))' $(if $(strip $(SET)),--set '$(subst ','\'',$(strip $(SET)))') \
		$(if $(filter 1 yes true,$(STRICT)),--refuse-mixed) --jobs $(JOBS)

book: $(STAMP) ## execute the notebooks, then build the HTML book with warnings as errors
	$(LOCK) $(MAKE) --no-print-directory _book

# The two steps of `make book` under one lock (make book takes it; the notebooks step inside does not again).
# Building the book never changes a committed file: the state of the tracked files under results/ and notebooks/ is
# taken before the build and compared after it (outside a git checkout there is nothing to compare). FORCE=1 asks to
# recompute the results, so it may.
COMMITTED_STATE := git status --porcelain --untracked-files=no -- results notebooks 2>/dev/null || true
_book: LOCK :=
_book:
	@mkdir -p book/_build && { $(COMMITTED_STATE); } > book/_build/.committed-before
	$(MAKE) --no-print-directory notebooks LOCK=
	$(JB) build book -W -n --keep-going
	@touch $(BOOK_HTML)/.nojekyll
	@$(if $(filter 1 yes true,$(strip $(FORCE))),true,{ $(COMMITTED_STATE); } | cmp -s - book/_build/.committed-before) || { \
		echo "error: building the book changed committed files (git status -- results notebooks); a build must leave them as they were" >&2; \
		exit 1; }
	@echo
	@echo "The book is at: $(abspath book/_build/html/index.html)"

serve: ## preview the built book at http://localhost:PORT/ (PORT=8000; build it first with make book)
	@if [ ! -f $(BOOK_HTML)/index.html ]; then \
		echo "error: no built book in $(BOOK_HTML); run make book (or make book PROFILE=smoke) first" >&2; exit 1; fi
	@echo "Serving $(abspath $(BOOK_HTML)) at http://localhost:$(PORT)/ (Ctrl-C stops it)"
	$(if $(wildcard $(PY)),$(PY),$(PYTHON_BOOT)) -m http.server $(PORT) --bind 127.0.0.1 --directory $(BOOK_HTML)

publish: $(STAMP) ## push book/_build/html to the gh-pages branch with .nojekyll (build it first: make book)
	@if [ ! -f $(BOOK_HTML)/index.html ]; then \
		echo "error: no built book in $(BOOK_HTML); run make book first" >&2; exit 1; fi
	@if [ -z "$$(git config --get remote.$(PAGES_REMOTE).url)" ]; then \
		echo "error: no git remote '$(PAGES_REMOTE)' to push to; add one (git remote add $(PAGES_REMOTE) URL) or set PAGES_REMOTE=" >&2; exit 1; fi
	$(PY) -m ghp_import --no-jekyll --push --force --remote $(PAGES_REMOTE) --branch $(PAGES_BRANCH) \
		--message "Book built from $$(git rev-parse --short HEAD)" $(BOOK_HTML)
	@echo "Published $(BOOK_HTML) to $(PAGES_REMOTE)/$(PAGES_BRANCH); in the repository's settings, let GitHub Pages serve that branch."

test: $(STAMP) ## run the library tests and every notebook at PROFILE=smoke
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

bench: $(STAMP) ## run every benchmarks/bench_*.py with --out results/bench (BENCH_OUT=...; QUICK=1: each one's --quick)
	@shopt -s nullglob; scripts=(benchmarks/bench_*.py); \
	if [ $${#scripts[@]} -eq 0 ]; then echo "no benchmarks/bench_*.py found"; exit 0; fi; \
	quick='$(if $(filter 1 yes true,$(QUICK)),1)'; failed=(); \
	for script in "$${scripts[@]}"; do \
		flags=(--out "$(BENCH_OUT)"); \
		if [ -n "$$quick" ]; then \
			if grep -q -e '"--quick"' "$$script"; then flags+=(--quick); \
			else echo "($$script has no --quick: it runs at its full size)"; fi; \
		fi; \
		echo "== $$script $${flags[*]}"; started=$$SECONDS; \
		$(BENCH_PY) "$$script" "$${flags[@]}" || failed+=("$$script"); \
		echo "== $$script took $$((SECONDS - started)) s"; \
	done; \
	echo; echo "== every figure beside its target (benchmarks/summary.py)"; \
	$(BENCH_PY) benchmarks/summary.py --out "$(BENCH_OUT)"; \
	if [ $${#failed[@]} -gt 0 ]; then echo "benchmarks failed: $${failed[*]}" >&2; exit 1; fi; \
	echo "benchmark results in $(abspath $(BENCH_OUT)); $$SECONDS s in all (target: 20 minutes on 2 idle cores$${quick:+; QUICK=1})"

bench-env: $(STAMP) ## .venv-bench: the project's packages (a .pth to them) plus BackPACK and Opacus, for make bench
	$(PYTHON_BOOT) -m venv $(BENCH_VENV)
	$(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > \
		"$$($(BENCH_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/dalign-project.pth"
	$(BENCH_VENV)/bin/pip install --no-deps backpack-for-pytorch==1.7.1 opacus==1.6.0 einops unfoldNd opt_einsum

clean: ## remove the built book, executed notebooks, caches and results/smoke (keeps the other profiles' results)
	rm -rf book/_build book/chapters .pytest_cache results/smoke
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -print0 | xargs -0 rm -rf
	find . -path ./$(VENV) -prune -o -type f -name '*.tmp' -print0 | xargs -0 rm -f

distclean: clean ## clean, and also remove .venv and the data cache .cache/
	rm -rf $(VENV) .cache
