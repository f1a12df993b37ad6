# Two commands do all the setup on a fresh machine with Python 3.11:
#   make train   creates .venv, installs the pinned dependencies, trains on the bundled sample with 2 local workers
#   make test    same setup, then the test suite
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv train test test-fast lint ui clean check-versions

venv: $(STAMP)

# torch is installed first and pinned: an open range would pull a multi-GB CUDA build. pyproject.toml's dependencies
# are the tested ranges; constraints.txt pins the one known-good set installed here (Ray 2.60.0, MLflow 3.17.2).
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

train: venv
	$(BIN)/python -m nre_ray.train --num-workers 2 $(ARGS)

# The suite in TEST_WORKERS processes (pytest-xdist); the users of the session's stand-in stay together in one
# (tests/standin_session.py). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: venv
	$(BIN)/python -m pytest -n $(TEST_WORKERS) $(ARGS)

test-fast: venv
	$(BIN)/python -m pytest -n $(TEST_WORKERS) -m "not integration" $(ARGS)

# The other tested releases of Ray and MLflow, each in its own venv under .versions/ (docs/development.md#versions):
# make check-versions [ARGS='--steps unit']
check-versions:
	scripts/check_versions.sh $(ARGS)

lint: venv
	$(BIN)/ruff check .

# make ui [PORT=5001] [HOST=0.0.0.0]: the MLflow UI on this folder's runs (mlflow.db), http://HOST:PORT
PORT ?= 5000
HOST ?= 127.0.0.1
# Without MLflow's job runner (nre_ray submits no MLflow jobs): 2 processes instead of 10, none polling while idle
# (nre_ray/cluster/local_settings.py, MLFLOW_SERVER_ENV); MLFLOW_SERVER_ENABLE_JOB_EXECUTION=true keeps it.
ui: venv
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=$${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false} $(BIN)/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlflow.db --host $(HOST) --port $(PORT)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .nre_ray_cache .versions
