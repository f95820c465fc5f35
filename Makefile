# The two commands that matter: `make demo` and `make test`. Both work on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
BUILD  := build

.PHONY: test-torch bench-cuda
.PHONY: all demo demo-cluster test lint proto contract native bench clean manifests helm e2e-bin e2e-go-check

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

# The scheduler extender on two simulated nodes: the default scheduler's choice fails, the extender's succeeds.
demo-cluster: all
	$(PY) -m devplugin_sim.demo_extender

# Helm, for the chart's tests (tests/deploy/test_helm_chart.py): built from the Go module proxy, with the version and
# the Kubernetes version of its client libraries set as Helm's own release builds set them.
HELM_VERSION := v3.22.0
HELM_K8S_MINOR := 37
HELM_LDFLAGS := -X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION) \
	$(foreach p,chartutil lint/rules,-X helm.sh/helm/v3/pkg/$(p).k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/$(p).k8sVersionMinor=$(HELM_K8S_MINOR))
helm: $(BUILD)/bin/.helm-$(HELM_VERSION)
$(BUILD)/bin/.helm-$(HELM_VERSION):
	mkdir -p $(BUILD)/bin
	GOBIN=$(abspath $(BUILD))/bin GOFLAGS=-mod=mod go install -ldflags '$(HELM_LDFLAGS)' helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)
	touch $@

test: all helm e2e-bin realk8s-tools ray-venv
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m pytest -q --durations=30

# PyTorch (its CUDA 13.0 build, 3 GB) in a venv of its own, and the tests that run it under the shim over the fake
# driver (tests/cuda/test_torch.py). Not part of `make test`: the download and install take 6 to 11 minutes on a cold
# 2-core machine (docs/testing.md, "What a first run costs").
TORCH_VENV := .venv-torch
$(TORCH_VENV)/.installed: requirements-torch.txt
	$(PYTHON) -m venv $(TORCH_VENV)
	$(TORCH_VENV)/bin/python -m pip install -q --upgrade pip
	$(TORCH_VENV)/bin/python -m pip install -q -r requirements-torch.txt
	touch $@

test-torch: all $(TORCH_VENV)/.installed
	$(PY) -m pytest -q -m torch tests/cuda/test_torch.py

# The shim's cost on real CUDA runtime calls and on PyTorch's allocator (docs/benchmarks.md).
bench-cuda: all $(TORCH_VENV)/.installed
	$(PY) bench/cuda_runtime_overhead.py --torch $(TORCH_VENV)/bin/python

# The real Kubernetes components the realk8s tests run (e2e/README.md), built into e2e/bin/ only when missing or
# when e2e's Go sources, go.mod or go.sum changed. Go's build cache makes a rebuild quick; a cold build takes
# minutes (e2e/README.md has the figure).
GO      ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
E2E_BIN := e2e/bin
# The KubeRay operator's release (its rule is further down); set before e2e-bin names it as a prerequisite.
KUBERAY_VERSION := v1.5.0
KUBERAY_MODULE  := github.com/ray-project/kuberay/ray-operator
E2E_MOD := e2e/go.mod e2e/go.sum
E2E_AGENT_SRC := $(shell find e2e/cmd/nodeagent e2e/internal -name '*.go' -o -name '*.s' 2>/dev/null)

e2e-bin: $(E2E_BIN)/etcd $(E2E_BIN)/kube-apiserver $(E2E_BIN)/kube-scheduler $(E2E_BIN)/kube-controller-manager \
	$(E2E_BIN)/nodeagent $(E2E_BIN)/containershim $(E2E_BIN)/serviceproxy $(E2E_BIN)/stubplugin $(E2E_BIN)/stubdra \
	$(E2E_BIN)/.ray-operator-$(KUBERAY_VERSION)

e2e-go-check:
	@$(GO) version >/dev/null 2>&1 || { echo "make e2e-bin needs Go 1.26 (https://go.dev/dl/) on PATH or GO=/path/to/go" >&2; exit 1; }

$(E2E_BIN)/kube-apiserver $(E2E_BIN)/kube-scheduler $(E2E_BIN)/kube-controller-manager: $(E2E_MOD) e2e/tools.go | e2e-go-check
	cd e2e && $(GO) build -o bin/ k8s.io/kubernetes/cmd/$(notdir $@)
	@touch $@

$(E2E_BIN)/etcd: $(E2E_MOD) $(wildcard e2e/cmd/etcd/*.go) | e2e-go-check
	cd e2e && $(GO) build -o bin/ ./cmd/etcd
	@touch $@

$(E2E_BIN)/nodeagent: $(E2E_MOD) $(E2E_AGENT_SRC) | e2e-go-check
	cd e2e && $(GO) build -o bin/ ./cmd/nodeagent
	@touch $@

$(E2E_BIN)/containershim: $(E2E_MOD) $(wildcard e2e/cmd/containershim/*.go e2e/internal/oci/*.go) | e2e-go-check
	cd e2e && $(GO) build -o bin/ ./cmd/containershim
	@touch $@

$(E2E_BIN)/serviceproxy: $(E2E_MOD) $(wildcard e2e/cmd/serviceproxy/*.go e2e/internal/svcproxy/*.go) | e2e-go-check
	cd e2e && $(GO) build -o bin/ ./cmd/serviceproxy
	@touch $@

$(E2E_BIN)/stubplugin: $(E2E_MOD) $(wildcard e2e/cmd/stubplugin/*.go) | e2e-go-check
	cd e2e && $(GO) build -o bin/ ./cmd/stubplugin
	@touch $@

$(E2E_BIN)/stubdra: $(E2E_MOD) $(wildcard e2e/cmd/stubdra/*.go) | e2e-go-check
	cd e2e && $(GO) build -o bin/ ./cmd/stubdra
	@touch $@

# The KubeRay operator the KubeRay tests run against the test cluster (tests/realk8s/kuberay.py), built from the Go
# module proxy as its own module: `go install` of the released version uses the operator's own go.mod (its
# Kubernetes client libraries), apart from e2e/go.mod's pinned Kubernetes. Its CRDs and RBAC are read from the same
# module in Go's module cache (`go mod download -json` prints where).
$(E2E_BIN)/.ray-operator-$(KUBERAY_VERSION): | e2e-go-check
	mkdir -p $(E2E_BIN)
	GOBIN=$(abspath $(E2E_BIN)) GOFLAGS=-mod=mod $(GO) install $(KUBERAY_MODULE)@$(KUBERAY_VERSION)
	touch $@

# Ray for the KubeRay tests' image (gpushare.test/ray:2.60.0, tests/realk8s/images.py): Ray 2.60.0 with its dashboard
# and autoscaler, and CuPy, in a venv of its own made from the project venv's Python (the image mounts both).
RAY_VENV := .venv-ray
.PHONY: ray-venv
ray-venv: $(RAY_VENV)/.installed
$(RAY_VENV)/.installed: requirements-ray.txt | $(VENV)/.installed
	$(PY) -m venv $(RAY_VENV)
	$(RAY_VENV)/bin/python -m pip install -q --upgrade pip
	$(RAY_VENV)/bin/python -m pip install -q -r requirements-ray.txt
	touch $@

# The container tools of the realk8s tests: runc runs the pods' containers (the node agent's --runtime runc),
# mmdebstrap and buildah build the product's image from the Dockerfile (tests/realk8s/product_image.py). Installed
# with apt-get when missing (as root); otherwise the message says what to install.
REALK8S_TOOLS := runc buildah mmdebstrap
.PHONY: realk8s-tools
realk8s-tools:
	@missing=$$(for t in $(REALK8S_TOOLS); do PATH="$$PATH:/usr/sbin:/sbin" command -v $$t >/dev/null 2>&1 || echo $$t; done); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing the realk8s tests' container tools:" $$missing; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	else \
	  echo "the realk8s tests need" $$missing "(they run as root): as root, apt-get install" $$missing >&2; exit 1; \
	fi

lint: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m mypy

proto: $(VENV)/.installed
	$(PY) -m devplugin.api.generate

contract: $(VENV)/.installed
	$(PY) -m devplugin.contract > shim/gpushare_contract.h

# daemonset.yaml, the default install (the node daemon alone), rendered from deploy/overlays/node-only.
manifests: $(VENV)/.installed
	{ printf '%s\n' '# Generated by `make manifests` from deploy/overlays/node-only: edit deploy/, not this file.' \
	  '# The node daemon alone. With the scheduler extender and webhooks: docs/guide/install.md.'; \
	  $(VENV)/bin/kubectl kustomize deploy/overlays/node-only; } > daemonset.yaml.new && mv daemonset.yaml.new daemonset.yaml

bench: all
	$(PY) bench/handlers.py
	$(PY) bench/admission.py
	$(PY) bench/admission.py --pods --admissions 1000
	-$(PY) bench/churn.py
	$(PY) bench/restart_and_health.py
	$(PY) bench/metrics_scrape.py
	$(PY) bench/shim_overhead.py
	$(PY) bench/scheduler.py

# Scheduling of GPU shares on the real kube-scheduler: DRA claims against device-plugin requests with the extender,
# and where shares land on a node (docs/benchmarks.md). Needs e2e/bin (`make e2e-bin`).
.PHONY: bench-dra
bench-dra: all
	$(PY) bench/dra_scheduling.py

# The gRPC C++ toolchain for the compiled admission client (bench/cpp), which bench/admission.py prefers.
.PHONY: bench-deps
bench-deps:
	$$( [ "$$(id -u)" = 0 ] || echo sudo ) apt-get install -y libgrpc++-dev protobuf-compiler-grpc protobuf-compiler libprotobuf-dev pkg-config

clean:
	rm -rf $(BUILD)
