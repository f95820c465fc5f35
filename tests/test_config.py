"""Broken settings, by flag or env var, are refused at start with a message naming the setting."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from devplugin.app.config import Config


@pytest.mark.parametrize(("overrides", "message"), [
    ({"ignored_xids": "13,x"}, "--ignored-xids '13,x' is not a comma-separated list of integers"),
    ({"resource_domain": "a/b"}, "must be a DNS domain"),
    ({"resource_domain": ""}, "must be a DNS domain"),
    ({"recovery_seconds": 0.0}, "--recovery-seconds must be positive"),
    ({"pair_window": -1.0}, "--pair-window must be positive"),
    ({"mem_unit": "3GiB"}, "512MiB"),
    ({"mode": "mig"}, "--mode 'mig' is not one of"),
    ({"placement": "random"}, "DEVPLUGIN_PLACEMENT"),
])
def test_bad_settings_are_named(overrides: dict, message: str) -> None:
    cfg = Config(**overrides)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        cfg.validate()


def test_defaults_are_valid() -> None:
    Config().validate()


@pytest.mark.parametrize(("env", "message"), [
    ({"DEVPLUGIN_RECOVERY_SECONDS": "soon"}, "env DEVPLUGIN_RECOVERY_SECONDS='soon' is not a float"),
    ({"DEVPLUGIN_MODE": "exclusive"}, "--mode 'exclusive' is not one of"),
])
def test_bad_env_values_exit_2_with_the_env_name(env: dict, message: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "devplugin", "serve"], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr
