"""What the node daemon writes, on the real kube-apiserver."""
