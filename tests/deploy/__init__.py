"""Tests of what ships: manifests (deploy/), the Helm chart, RBAC, the image (Dockerfile)."""
