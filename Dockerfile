# One image for the whole stack: `devplugin serve` (the node daemon, the default command), `devplugin scheduler`
# (scheduler extender and admission webhooks) and `devplugin inspect`, plus the isolation shim the node daemon hands
# to containers.
#
#   docker build -t gpushare/devplugin:0.1.0 .
#
# Both stages use Debian 12 (bookworm), the toolchain the shim is developed and tested with (gcc 12, -Werror). The
# shim still loads in containers with glibc down to 2.17 (shim/gs_glibc_compat.h).
#
# BASE is both stages' base image. Another base must be Debian 12 with Python 3.11 as `python` and `pip` first on
# PATH, as the default is; the tests build the image from a base made of Debian's own packages
# (tests/realk8s/product_image.py):  docker build --build-arg BASE=<that base> .
ARG BASE=python:3.11-slim-bookworm

# ---- build: the shim library and the product's wheel -------------------------------------------------------------
FROM ${BASE} AS build
# Debian's package versions move under a fixed base tag, so pinned versions would break the build; the base image
# tag fixes the distribution release, and these packages never reach the runtime stage.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev make \
    && rm -rf /var/lib/apt/lists/*
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY pyproject.toml README.md ./
COPY devplugin/ devplugin/
COPY shim/ shim/
# The shim's contract header, shim/gpushare_contract.h, is generated from devplugin/contract.py (the one source of
# the env, mount and limits-file names) by `make contract`, and tests/contract/test_generated_code.py fails while it is
# stale: the build compiles the header as copied, so this stage needs none of the package's dependencies. `lib` is
# the library alone, as shipped (it ignores GPUSHARE_REAL_LIBCUDA / _LIBNVML, which only the tests' build
# honours): the shim's test programs need the fake driver (fakes/), which has no place in the image. The wheel
# holds the `devplugin` package only (pyproject.toml).
RUN make -C shim BUILD=/src/out lib \
    && pip wheel --no-cache-dir --no-deps -w /src/out/wheels .

# ---- runtime: Python, the installed wheel and the shim; no compilers ----------------------------------------------
FROM ${BASE}
LABEL org.opencontainers.image.title="gpushare-devplugin" \
      org.opencontainers.image.description="Share GPUs between Kubernetes pods: node daemon, isolation shim, scheduler extender and webhooks" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
COPY --from=build /src/out/wheels/ /tmp/wheels/
RUN pip install --no-cache-dir /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels
# The shim as shipped; the DaemonSet's initContainer copies it to the host path that the node daemon mounts into
# containers (--shim-lib, default /usr/local/gpushare/lib/libgpushare.so), through a rename so that running
# containers keep the copy they loaded:
#   sh -c 'mkdir -p /host/lib && cp /opt/gpushare/lib/libgpushare.so /host/lib/libgpushare.so.new
#          && mv /host/lib/libgpushare.so.new /host/lib/libgpushare.so'      (host /usr/local/gpushare on /host)
COPY --from=build /src/out/libgpushare.so /opt/gpushare/lib/libgpushare.so
# A non-root user for `devplugin scheduler` and `devplugin inspect` (securityContext runAsUser: 65532,
# runAsNonRoot: true). The image's default user stays root because its default command, the node daemon, needs it:
# it creates its sockets in the kubelet's /var/lib/kubelet/device-plugins, reads the kubelet's pod-resources socket
# and writes the shim's host directories, all owned by root on the node (its initContainer, which writes the shim
# to the host, likewise).
RUN groupadd --system --gid 65532 gpushare \
    && useradd --system --uid 65532 --gid 65532 --create-home --home-dir /home/gpushare \
       --shell /usr/sbin/nologin gpushare
# Docker's own check of the node daemon's /healthz (port DEVPLUGIN_HEALTH_PORT, 8089 by default; 0 turns the
# endpoint and this check off). The slim image has no curl: Python's urllib asks. Kubernetes ignores HEALTHCHECK and
# uses the manifests' probes; `docker run` of `scheduler` or `inspect` should pass --no-healthcheck.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; p = os.environ.get('DEVPLUGIN_HEALTH_PORT', '8089'); p == '0' or u.urlopen('http://127.0.0.1:' + p + '/healthz', timeout=4)"]
EXPOSE 8089
ENTRYPOINT ["devplugin"]
CMD ["serve"]
