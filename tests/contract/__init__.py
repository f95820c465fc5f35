"""Tests of the contract (devplugin/contract.py, devplugin/bounded.py): annotation formats, bounded parsing,
generated code."""
