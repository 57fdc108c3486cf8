"""What is tuned: the problem, the kernel config, the search space, the built-in defaults,
the GPU and software a result belongs to, and the tuned-result records themselves.

Pure data and validation; nothing here imports PyTorch or Triton at module level, so the
package import stays cheap.
"""
