"""NVIDIA's CUDA runtime, CuPy and PyTorch under the shim over the fake driver; the probes they run."""
