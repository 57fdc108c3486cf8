"""What a measurement ran on: the GPU (or Triton's interpreter) and the software stack."""
from __future__ import annotations

import platform
import re
from dataclasses import asdict, dataclass
from functools import lru_cache

INTERPRETER = "interpreter"


@dataclass(frozen=True)
class GpuInfo:
    name: str
    capability: str  # "9.0", or "interpreter" when kernels run on the CPU
    sm_count: int
    memory_mb: int
    driver: str

    @property
    def is_interpreter(self) -> bool:
        return self.capability == INTERPRETER

    @property
    def capability_tuple(self) -> tuple[int, int] | None:
        if self.is_interpreter:
            return None
        major, minor = self.capability.split(".")
        return int(major), int(minor)

    @property
    def arch(self) -> str:
        """Search-space architecture key: sm90 (Hopper and newer), sm80, or interpreter."""
        cap = self.capability_tuple
        if cap is None:
            return INTERPRETER
        return "sm90" if cap >= (9, 0) else "sm80"

    @property
    def slug(self) -> str:
        """File-name friendly GPU name: "NVIDIA H200" -> "nvidia-h200"."""
        return re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class SoftwareInfo:
    triton: str
    torch: str
    cuda: str
    fa_autotune: str
    template_hash: str

    def to_dict(self) -> dict:
        return asdict(self)


def interpreter_gpu() -> GpuInfo:
    """The stand-in identity of Triton's interpreter on this CPU."""
    cpu = platform.processor() or platform.machine() or "cpu"
    return GpuInfo(f"Triton interpreter ({cpu})", INTERPRETER, 0, 0, "none")


@lru_cache(maxsize=None)
def detect_gpu(index: int = 0) -> GpuInfo:
    """The CUDA device ``index``, or the interpreter when there is no GPU."""
    import torch

    if not torch.cuda.is_available():
        return interpreter_gpu()
    props = torch.cuda.get_device_properties(index)
    from .bench import _driver_version

    return GpuInfo(props.name, f"{props.major}.{props.minor}", props.multi_processor_count,
                   props.total_memory // 2**20, _driver_version() or "unknown")


@lru_cache(maxsize=None)
def detect_software() -> SoftwareInfo:
    import torch
    import triton

    from . import __version__
    from .codegen import template_hash

    return SoftwareInfo(triton.__version__, torch.__version__, torch.version.cuda or "none", __version__,
                        template_hash())
