"""Tests of the daemon's NVML side (devplugin/gpu/): inventory, health, topology, MIG layouts."""
