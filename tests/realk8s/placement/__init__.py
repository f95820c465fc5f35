"""Placement on the real cluster: scenarios, bursts, churn, faults, GPU selection, NVLink, MIG, KubeRay."""
