"""The real Kubernetes components in the tests: binaries built by `make e2e-bin` into e2e/bin/, and launchers."""
