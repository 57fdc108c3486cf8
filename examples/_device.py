"""Where the examples run: a CUDA GPU in bf16, or the CPU in fp16 through Triton's interpreter,
which must be chosen before Python starts (TRITON_INTERPRET=1); without either, say so and stop."""
import os
import sys

import torch


def pick_device() -> tuple[str, torch.dtype]:
    """("cuda", bfloat16) on a GPU; ("cpu", float16) in the interpreter (it computes bf16 dot
    products wrong); exits with the command to run otherwise."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if torch.cuda.is_available() and not interpreted:
        return "cuda", torch.bfloat16
    if not interpreted:
        sys.exit("No GPU: the kernels can run on the CPU in Triton's interpreter, which must be chosen before "
                 "Python starts:\n    TRITON_INTERPRET=1 python " + " ".join(sys.argv))
    print("note: running on the CPU in Triton's interpreter (TRITON_INTERPRET=1, set before Python started): slow, "
          "so the shapes here are tiny")
    return "cpu", torch.float16
