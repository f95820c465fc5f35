# The node daemon image: `devplugin serve` plus the isolation shim it hands to containers.
FROM debian:12-slim AS shim
RUN apt-get update && apt-get install -y --no-install-recommends gcc make libc6-dev python3 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY devplugin/contract.py devplugin/contract.py
COPY shim/ shim/
RUN make -C shim BUILD=/out

FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY devplugin/ devplugin/
RUN pip install --no-cache-dir . && rm -rf /root/.cache
# The DaemonSet copies the shim to the host path it mounts into containers (see daemonset.yaml).
COPY --from=shim /out/libgpushare.so /opt/gpushare/lib/libgpushare.so
ENTRYPOINT ["devplugin", "serve"]
