"""`devplugin inspect` against the real kube-apiserver."""
