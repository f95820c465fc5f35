"""Helpers shared by the tests of several rooms: the daemon harness, shim probes, node and scheduler objects,
rendered manifests, the fake driver's fixtures."""
