"""The daemon's view of the node's GPUs: inventory and health, through NVML (pynvml). No other module calls pynvml."""
