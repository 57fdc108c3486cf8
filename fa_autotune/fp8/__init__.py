"""FP8 inputs for the FP8 attention kernels: quantization with per-tensor, per-head or
per-block descales, the randomized Hadamard rotation (incoherent processing), and the fused
Triton passes that do both on the GPU."""
