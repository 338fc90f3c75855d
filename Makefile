# The two commands a fresh machine needs (README): `make run` and `make test`.
# Both create .venv and build the native extension (cffi) first; `make run` installs only what
# the main job needs (the package), `make test` adds the test and serving extras.
PYTHON ?= python3
VENV ?= .venv
STAMP := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run

.PHONY: run test test-all bench clean fuzz fio-compat fio-compat-tests fio-newer test-engines-next

SOURCES := pyproject.toml setup.py native/cxlhm_native.c native/cxlhm_native.h native/cxlhm_uffd.c native/cxlhm_uffd.h native/cxlhm_copy.c native/cxlhm_copy.h native/build_native.py

# the package alone (no torch, no test tools): the main job; an existing .venv is kept
$(RUN_STAMP): $(SOURCES)
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -e .
	touch $(RUN_STAMP)

# everything the suite needs: the test extra (pytest, hypothesis, libcachesim, redis and a
# redis-server build) and the serving extra
$(STAMP): $(RUN_STAMP)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test,serving]'
	touch $(STAMP)

# The serving engines' wheels, without their GPU stacks (tests/test_engine_*.py load their real classes)
ENGINES := $(VENV)/.engines
$(ENGINES): $(STAMP) requirements-engines.txt
	$(VENV)/bin/pip install -q --no-deps -r requirements-engines.txt
	touch $(ENGINES)

# The engine tests against the engines' next releases (requirements-engines-next.txt), in a venv of
# their own (.venv-next; never touches .venv, which keeps the pinned ones): the project's dependencies
# and the light packages as in .venv, the newest engines on top with --no-deps. Each run installs the
# working tree's code into .venv-next (built under build/, not in place) and runs pytest from there.
VENV_NEXT ?= .venv-next
ENGINE_NAMES := sglang vllm lmcache mooncake-transfer-engine
$(VENV_NEXT)/.engines: pyproject.toml setup.py requirements-engines.txt requirements-engines-next.txt
	$(PYTHON) -m venv $(VENV_NEXT)
	$(VENV_NEXT)/bin/pip install -q --upgrade pip
	$(VENV_NEXT)/bin/pip install -q '.[test,serving]'
	grep -vE '^(#|$$|($(subst $(eval) ,|,$(ENGINE_NAMES)))==)' requirements-engines.txt > $(VENV_NEXT)/light.txt
	$(VENV_NEXT)/bin/pip install -q --no-deps -r $(VENV_NEXT)/light.txt -r requirements-engines-next.txt
	touch $@

test-engines-next: $(VENV_NEXT)/.engines  ## the engine tests on the engines' next releases (pre-releases included)
	@for e in $(ENGINE_NAMES); do \
	  newest=$$($(VENV_NEXT)/bin/pip index versions --pre $$e 2>/dev/null | sed -n 's/^[^ ]* (\(.*\))$$/\1/p'); \
	  pinned=$$(sed -n "s/^$$e==//p" requirements-engines-next.txt); \
	  [ -z "$$newest" ] || [ "$$newest" = "$$pinned" ] || echo "NOTE: $$e $$newest is in the registry; requirements-engines-next.txt pins $$pinned"; \
	done
	$(VENV_NEXT)/bin/pip install -q --no-deps --force-reinstall .
	$(VENV_NEXT)/bin/pytest $(wildcard tests/test_engine_*.py) $(ARGS)

run: $(RUN_STAMP)  ## the main job: the Mooncake trace through the KV store, LRU vs hymcache with hints
	$(VENV)/bin/cxlhm run $(ARGS)

test: $(STAMP) $(ENGINES)  ## the test suite (fast default; slow cases: make test-all)
	$(VENV)/bin/pytest $(ARGS)

test-all: $(STAMP) $(ENGINES)
	$(VENV)/bin/pytest -m '' $(ARGS)

bench: $(STAMP)  ## every bench in bench/ (minutes; prints ratios against baselines measured in the same run)
	for b in bench/bench_*.py; do $(VENV)/bin/python $$b || exit 1; done

fuzz: $(STAMP) $(ENGINES)  ## every untrusted input at volume (FUZZ_CASES each, default 100000; FUZZ_JOBS at once), counts printed
	$(VENV)/bin/pip install -q atheris  # the coverage-guided generator for the parsers (not a runtime dependency)
	cd tests && $(abspath $(VENV))/bin/python fuzz_volume.py --cases $${FUZZ_CASES:-100000} --jobs $${FUZZ_JOBS:-2} $(ARGS)

fio-compat: $(STAMP)  ## fio's own examples through real fio and cxlhm fio, compared (FIO_EXAMPLES, FIO_SOURCE, or fetched)
	$(VENV)/bin/python -m cxlhm_apps.fio.compat --fetch-if-missing $(ARGS)

fio-compat-tests: $(STAMP)  ## fio's own regression jobs (t/jobs) through real fio and cxlhm fio, compared
	$(VENV)/bin/python -m cxlhm_apps.fio.compat --corpus tests --fetch-if-missing $(ARGS)

# real fio built from source at the corpus manifest's commit (needs gcc make libaio-dev zlib1g-dev;
# FIO_GIT: a clone of fio to build from where GitHub is unreachable); then ARGS="--fio built"
fio-newer: $(RUN_STAMP)  ## fio at the examples' commit, built once into ~/.cache/cxlhm/fio-build/<commit>/
	$(VENV)/bin/python -m cxlhm_apps.fio.fio_build

clean:
	rm -rf $(VENV) build *.egg-info cxlhm/_native*.so
