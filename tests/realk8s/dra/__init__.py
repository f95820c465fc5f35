"""DRA mode on the real kube-apiserver and kube-scheduler."""
