"""Tests of the node daemon's Kubernetes side (devplugin/kube/): client, pod cache, node watch, labels, the
writer."""
