"""Broken settings, by flag or env var, are refused at start with a message naming the setting."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from devplugin.app.config import Config, add_arguments, from_args


@pytest.mark.parametrize(("overrides", "message"), [
    ({"ignored_xids": "13,x"}, "--ignored-xids '13,x' is not a comma-separated list of integers"),
    ({"reset_xids": "48;79"}, "--reset-xids '48;79' is not a comma-separated list of integers (set by flag or "
                              "DEVPLUGIN_RESET_XIDS)"),
    ({"reset_xids": "48,43"}, "XID 43 is in both --ignored-xids and --reset-xids"),
    ({"state_dir": ""}, "--state-dir must name a directory (set by flag or DEVPLUGIN_STATE_DIR)"),
    ({"resource_domain": "a/b"}, "must be a DNS domain"),
    ({"resource_domain": ""}, "must be a DNS domain"),
    ({"recovery_seconds": 0.0}, "--recovery-seconds 0.0 must be a finite number greater than 0"),
    ({"pair_window": -1.0}, "--pair-window -1.0 must be a finite number greater than 0"),
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


FLOATS = [("pair_window", "DEVPLUGIN_PAIR_WINDOW"), ("recovery_seconds", "DEVPLUGIN_RECOVERY_SECONDS"),
          ("apiserver_timeout", "DEVPLUGIN_APISERVER_TIMEOUT")]


@pytest.mark.parametrize(("name", "env"), FLOATS)
@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-inf", "1e309", "0", "-0.5"])
def test_every_float_setting_must_be_finite_and_positive_by_flag_and_by_env(
        name: str, env: str, text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    flag = "--" + name.replace("_", "-")
    for argv, environ in (([f"{flag}={text}"], {}), ([], {env: text})):
        for key, value in environ.items():
            monkeypatch.setenv(key, value)
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        with pytest.raises(ValueError, match=f"^{flag} .* must be a finite number greater than 0 .*{env}"):
            from_args(parser.parse_args(argv))
        monkeypatch.delenv(env, raising=False)


@pytest.mark.parametrize(("name", "too_big", "bound"), [
    ("pair_window", 61.0, "60"), ("recovery_seconds", 86401.0, "86400"), ("apiserver_timeout", 301.0, "300"),
])
def test_float_settings_have_a_sensible_upper_bound(name: str, too_big: float, bound: str) -> None:
    with pytest.raises(ValueError, match=f"at most {bound} "):
        Config(**{name: too_big}).validate()
    Config(**{name: float(bound)}).validate()


def test_reset_xids_and_state_dir_come_from_flags_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cfg = from_args(parser.parse_args([]))
    assert cfg.reset_xid_set() == frozenset({48, 63, 64, 74, 79, 92, 94, 95})
    assert cfg.state_dir == "/var/lib/gpushare"
    monkeypatch.setenv("DEVPLUGIN_RESET_XIDS", "48, 79")
    monkeypatch.setenv("DEVPLUGIN_STATE_DIR", "/srv/gpushare")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cfg = from_args(parser.parse_args([]))
    assert (cfg.reset_xid_set(), cfg.state_dir) == (frozenset({48, 79}), "/srv/gpushare")
    cfg = from_args(parser.parse_args(["--reset-xids", "", "--state-dir", "/x"]))
    assert (cfg.reset_xid_set(), cfg.state_dir) == (frozenset(), "/x")


def test_a_nan_env_value_exits_2_naming_the_env_var() -> None:
    proc = subprocess.run([sys.executable, "-m", "devplugin", "serve"], capture_output=True, text=True,
                          env={**os.environ, "DEVPLUGIN_PAIR_WINDOW": "nan"}, timeout=60)
    assert proc.returncode == 2
    assert "--pair-window nan must be a finite number greater than 0 and at most 60 (set by flag or " \
           "DEVPLUGIN_PAIR_WINDOW)" in proc.stderr
