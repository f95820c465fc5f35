"""Tests of the scheduler extender and its webhooks (devplugin/scheduler/)."""
