"""Tests of DRA mode (devplugin/dra/): slices, claims, prepare, the gRPC services; the objects they share
(objects.py, recorded/) and a bare kube-apiserver with the real kube-scheduler (realk8s_dra.py)."""
