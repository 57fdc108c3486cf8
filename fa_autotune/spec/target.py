"""What a measurement ran on: the GPU (or Triton's interpreter) and the software stack."""
from __future__ import annotations

import datetime as dt
import platform
import re
import subprocess
from dataclasses import asdict, dataclass
from functools import lru_cache

from .._version import __version__
from ..paths import template_hash

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

    def same_model(self, other: "GpuInfo") -> bool:
        """Same GPU model (name slug and capability), whatever its driver or memory."""
        return self.slug == other.slug and self.capability == other.capability

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


def interpreter_active() -> bool:
    """Whether ``triton.jit`` builds interpreted kernels in this process.

    Triton fixes this when it is imported (``TRITON_INTERPRET=1``): its own library
    functions are built in one mode, so a process runs either interpreted or compiled
    kernels, never both.
    """
    from triton import knobs

    return bool(knobs.runtime.interpret)


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
    return GpuInfo(props.name, f"{props.major}.{props.minor}", props.multi_processor_count,
                   props.total_memory // 2**20, driver_version() or "unknown")


@lru_cache(maxsize=None)
def detect_software() -> SoftwareInfo:
    import torch
    import triton

    return SoftwareInfo(triton.__version__, torch.__version__, torch.version.cuda or "none", __version__,
                        template_hash())


def driver_version() -> str | None:
    """The NVIDIA driver version nvidia-smi reports, or None without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def environment() -> dict:
    """Date, GPU and software versions: what every committed result must carry."""
    import torch

    software = detect_software()
    info = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "torch": software.torch,
        "triton": software.triton,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "fa_autotune": software.fa_autotune,
        "template_hash": software.template_hash,
    }
    if torch.cuda.is_available():
        gpu = detect_gpu(0)
        info.update(gpu=gpu.name, capability=gpu.capability, sm_count=gpu.sm_count, memory_mb=gpu.memory_mb,
                    driver=gpu.driver)
    return info
