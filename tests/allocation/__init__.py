"""Tests of the allocator (devplugin/allocation/): units, the node view, placement, pod identity, node-local
pairing, envs."""
