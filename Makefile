# Two commands: `make demo` and `make test`. Each creates .venv, installs the project and
# makes sure java exists (ZooKeeper runs from the jars inside the pyspark wheel).
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# two workers, a file's tests together on one (tests/conftest.py); `make test PYTEST_WORKERS=` runs one by one
PYTEST_WORKERS ?= -n 2 --dist loadgroup

.PHONY: demo test install java chromium redis clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@echo "make: installing dlog and its dependencies into $(VENV) (a few minutes the first time)"
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

java:
	@scripts/ensure-java.sh

chromium:
	@scripts/ensure-chromium.sh

redis: install
	@scripts/ensure-redis.sh

demo: install java
	@echo "make: starting the demo (ZooKeeper, 3 bookies, then Spark)"
	@$(VENV)/bin/python -m dlog_tools.demo

# The suite starts hundreds of Python processes (bookies, dlog commands, servers, Spark workers):
# compileall writes the project's bytecode first, so none of them compiles the sources again where
# the environment sets PYTHONDONTWRITEBYTECODE (then no process writes a .pyc, but each reads one:
# a bookie's imports took ~1.5 s of CPU without them, ~0.9 s with them). Up-to-date files are skipped.
test: install java chromium redis
	$(VENV)/bin/python -m compileall -q -j 0 bookkeeper dlog dlog_tools dlog_spark pyspark_dlog.py tests
	$(VENV)/bin/python -m pytest $(PYTEST_WORKERS) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache *.egg-info
