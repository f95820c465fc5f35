"""What a pod sees of its GPUs from inside its container, on the real cluster."""
