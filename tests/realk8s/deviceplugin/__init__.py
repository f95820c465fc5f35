"""The node daemon against the kubelet's real device manager."""
