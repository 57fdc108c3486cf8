"""Kernel variants: render templates into Triton modules (kernels and constants only), the one
host launcher that runs them, the checks a config must pass for given tensors, and
ahead-of-time compilation for a GPU architecture without a GPU."""
