"""Tests of `make demo` and `make demo-cluster` (devplugin_sim/demo*.py)."""
