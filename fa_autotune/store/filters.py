"""Filters shared by every read of the database; None means any."""
from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Select

from ..spec.problem import canonical_dtype
from ..spec.target import GpuInfo
from .models import GpuModel, MeasurementModel, ProblemModel, SoftwareModel


@dataclass(frozen=True)
class Filters:
    gpu: str | None = None  # substring of the GPU name, case-insensitive
    dtype: str | None = None
    head_dim: int | None = None
    causal: bool | None = None
    status: str | None = None  # measurements only
    problem: str | None = None  # exact problem key
    gpu_model: GpuInfo | None = None  # exactly this GPU model (name and capability)
    template_hash: str | None = None

    def apply(self, stmt: Select, with_status: bool = True) -> Select:
        """``stmt`` (which joins the problem, GPU and software tables) narrowed to the filters."""
        if self.gpu:
            stmt = stmt.where(GpuModel.name.ilike(f"%{self.gpu}%"))
        if self.gpu_model is not None:
            stmt = stmt.where(GpuModel.name == self.gpu_model.name, GpuModel.capability == self.gpu_model.capability)
        if self.dtype:
            stmt = stmt.where(ProblemModel.dtype == canonical_dtype(self.dtype))
        if self.head_dim is not None:
            stmt = stmt.where(ProblemModel.head_dim == self.head_dim)
        if self.causal is not None:
            stmt = stmt.where(ProblemModel.causal == self.causal)
        if self.problem:
            stmt = stmt.where(ProblemModel.key == self.problem)
        if self.template_hash:
            stmt = stmt.where(SoftwareModel.template_hash == self.template_hash)
        if with_status and self.status:
            stmt = stmt.where(MeasurementModel.status == self.status)
        return stmt
