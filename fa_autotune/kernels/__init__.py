"""Kernel variants: render templates into Triton modules (kernels and constants only), the launch
plans that run them (one per family), the checks a config must pass for given tensors, and
ahead-of-time compilation for a GPU architecture without a GPU."""
