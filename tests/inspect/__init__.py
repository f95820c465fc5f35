"""Tests of `devplugin inspect` (devplugin/inspect/)."""
