"""The shipped manifests and image on the real Kubernetes components."""
