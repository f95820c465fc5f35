"""What the node's NVIDIA container toolkit accepts as a container's GPU grant, read from its config
(/etc/nvidia-container-runtime/config.toml), and the device-list strategy that follows from it.

The toolkit's runtime hook (nvidia-container-toolkit, cmd/nvidia-container-runtime-hook/container_config.go) takes
a container's device list from `/dev/null` mounts under /var/run/nvidia-container-devices when
`accept-nvidia-visible-devices-as-volume-mounts` is true, and otherwise, or when there are none, from
NVIDIA_VISIBLE_DEVICES, but in an unprivileged container only when
`accept-nvidia-visible-devices-envvar-when-unprivileged` is true (its default). A grant by mounts cannot be forged
by anything a pod writes in its spec (a pod cannot make mounts there: the webhook refuses volumeMounts under that
path, and Pod Security `baseline` refuses hostPath volumes); a grant by env can (every CUDA image sets
NVIDIA_VISIBLE_DEVICES=all), and then only the webhooks' void stands between a tenant and every GPU of its node.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

DEFAULT_PATH = "/etc/nvidia-container-runtime/config.toml"
ACCEPT_ENVVAR = "accept-nvidia-visible-devices-envvar-when-unprivileged"
ACCEPT_MOUNTS = "accept-nvidia-visible-devices-as-volume-mounts"
AUTO = "auto"


class ToolkitConfigError(ValueError):
    """The toolkit's config cannot be read as TOML, or a setting is not a boolean."""


@dataclass(frozen=True)
class ToolkitConfig:
    """The two settings of the toolkit's config that decide what grants a GPU (the toolkit's defaults when its
    config does not set them); `found` is False when the file does not exist."""

    accept_envvar_unprivileged: bool = True
    accept_volume_mounts: bool = False
    found: bool = False
    path: str = DEFAULT_PATH


def read(path: str | Path = DEFAULT_PATH) -> ToolkitConfig:
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        return ToolkitConfig(path=str(p))
    except OSError as exc:
        raise ToolkitConfigError(f"cannot read the NVIDIA container toolkit's config {p}: {exc}") from exc
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ToolkitConfigError(f"the NVIDIA container toolkit's config {p} is not TOML: {exc}") from exc
    out = {}
    for key, default in ((ACCEPT_ENVVAR, True), (ACCEPT_MOUNTS, False)):
        value = doc.get(key, default)
        if not isinstance(value, bool):
            raise ToolkitConfigError(f"{p}: {key} = {value!r} is not true or false")
        out[key] = value
    return ToolkitConfig(out[ACCEPT_ENVVAR], out[ACCEPT_MOUNTS], True, str(p))


@dataclass(frozen=True)
class Choice:
    """The strategy the daemon uses, and what an operator should know about it (log lines)."""

    strategy: str
    warnings: tuple[str, ...] = ()


def choose(requested: str, toolkit: ToolkitConfig) -> Choice:
    """`auto`: volume-mounts where the toolkit accepts volume mounts, envvar otherwise. An explicit strategy is
    kept; volume-mounts on a toolkit that does not accept them is refused (every GPU container would fail to start
    with `unknown device`), unless the config was not found (the daemon cannot see it: the operator's word
    stands)."""
    fix = (f"set {ACCEPT_MOUNTS} = true and {ACCEPT_ENVVAR} = false in {toolkit.path} on every GPU node "
           "(docs/reference/security.md)")
    warnings: list[str] = []
    strategy = requested
    if requested == AUTO:
        strategy = "volume-mounts" if toolkit.accept_volume_mounts else "envvar"
    if strategy == "volume-mounts" and toolkit.found and not toolkit.accept_volume_mounts:
        raise ToolkitConfigError(f"--device-list-strategy volume-mounts, but the node's container toolkit "
                                 f"({toolkit.path}) does not accept volume mounts: every GPU container would fail "
                                 f"with 'unknown device'; {fix}, or use --device-list-strategy auto")
    if strategy == "envvar":
        warnings.append(f"device-list strategy envvar: a container's own NVIDIA_VISIBLE_DEVICES (every CUDA image "
                        f"sets it to all) names GPUs, and only the admission webhooks' void keeps a pod from every "
                        f"GPU of its node; to make the grant unforgeable, {fix}")
    elif toolkit.accept_envvar_unprivileged and strategy in ("volume-mounts", "cdi-cri"):
        warnings.append(f"device-list strategy {strategy}, but the node's container toolkit still honours "
                        f"NVIDIA_VISIBLE_DEVICES in unprivileged containers ({ACCEPT_ENVVAR} is true): a container "
                        f"granted no GPU can still name one by env; {fix}")
    if not toolkit.found:
        warnings.append(f"the NVIDIA container toolkit's config {toolkit.path} was not found: the toolkit's "
                        "defaults were assumed (mount it into the daemon's pod read-only)")
    return Choice(strategy, tuple(warnings))
