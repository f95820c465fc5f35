"""The extender's webhooks as the real kube-apiserver calls them."""
