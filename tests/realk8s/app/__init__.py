"""The node daemon's metrics access on the real kube-apiserver."""
