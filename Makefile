# The two commands that matter: `make demo` and `make test`. Both work on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
BUILD  := build

.PHONY: all demo test lint proto contract native bench clean

all: native $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

# Native parts: the fake NVML/CUDA drivers (fakes/) and the isolation shim (shim/).
native:
	$(MAKE) -C fakes BUILD=$(abspath $(BUILD))/fakes
	@if [ -f shim/Makefile ]; then $(MAKE) -C shim BUILD=$(abspath $(BUILD))/shim; fi

demo: all
	$(PY) -m devplugin demo

test: all
	$(PY) -m ruff check .
	$(PY) -m pytest -q

lint: $(VENV)/.installed
	$(PY) -m ruff check .

proto: $(VENV)/.installed
	$(PY) -m devplugin.api.generate

contract: $(VENV)/.installed
	$(PY) -m devplugin.contract > shim/gpushare_contract.h

bench: all
	$(PY) bench/handlers.py
	$(PY) bench/admission.py
	$(PY) bench/admission.py --pods --admissions 1000
	-$(PY) bench/churn.py
	$(PY) bench/restart_and_health.py
	$(PY) bench/shim_overhead.py

# The gRPC C++ toolchain for the compiled admission client (bench/cpp), which bench/admission.py prefers.
.PHONY: bench-deps
bench-deps:
	$$( [ "$$(id -u)" = 0 ] || echo sudo ) apt-get install -y libgrpc++-dev protobuf-compiler-grpc protobuf-compiler libprotobuf-dev pkg-config

clean:
	rm -rf $(BUILD)
