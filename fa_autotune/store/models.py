"""SQLAlchemy models of the results database (style of Optuna's storages/_rdb/models.py).

Tables carry an ``fa_`` prefix so Optuna's own tables can live in the same database.
Rows are identity-deduplicated (a GPU, a software stack, a problem, a config each get one
row); a measurement links them with its status and numbers.
"""
from __future__ import annotations

import datetime as dt

from sqlalchemy import (
    Boolean, DateTime, Float, ForeignKey, Integer, String, Text, UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from ..spec.candidate import Candidate
from ..spec.problem import Problem
from ..spec.target import GpuInfo, SoftwareInfo

SCHEMA_VERSION = 3
# Optuna-style terminal states of one trial; only "ok" rows carry timings.
STATUSES = ("ok", "invalid_config", "compile_error", "out_of_resources", "wrong_result", "timeout", "crashed")
# Statuses that say something about the config itself, so a repeat can be answered from the
# database; timeouts and crashes may be the machine's fault and are retried.
REUSABLE_STATUSES = ("ok", "invalid_config", "compile_error", "out_of_resources", "wrong_result")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


class Base(DeclarativeBase):
    pass


class SchemaVersionModel(Base):
    __tablename__ = "fa_schema_version"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    upgraded_at: Mapped[dt.datetime] = mapped_column(DateTime, default=_now)


class GpuModel(Base):
    __tablename__ = "fa_gpus"
    __table_args__ = (UniqueConstraint("name", "capability", "sm_count", "memory_mb", "driver"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), nullable=False)
    capability: Mapped[str] = mapped_column(String(16), nullable=False)  # "9.0", or "interpreter"
    sm_count: Mapped[int] = mapped_column(Integer, nullable=False)
    memory_mb: Mapped[int] = mapped_column(Integer, nullable=False)
    driver: Mapped[str] = mapped_column(String(64), nullable=False)

    def to_gpu(self) -> GpuInfo:
        return GpuInfo(self.name, self.capability, self.sm_count, self.memory_mb, self.driver)


class SoftwareModel(Base):
    __tablename__ = "fa_software"
    __table_args__ = (UniqueConstraint("triton", "torch", "cuda", "fa_autotune", "template_hash"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    triton: Mapped[str] = mapped_column(String(32), nullable=False)
    torch: Mapped[str] = mapped_column(String(64), nullable=False)
    cuda: Mapped[str] = mapped_column(String(32), nullable=False)
    fa_autotune: Mapped[str] = mapped_column(String(32), nullable=False)
    template_hash: Mapped[str] = mapped_column(String(32), nullable=False)

    def to_software(self) -> SoftwareInfo:
        return SoftwareInfo(self.triton, self.torch, self.cuda, self.fa_autotune, self.template_hash)


class ProblemModel(Base):
    __tablename__ = "fa_problems"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(160), unique=True, nullable=False)
    batch: Mapped[int] = mapped_column(Integer, nullable=False)
    heads_q: Mapped[int] = mapped_column(Integer, nullable=False)
    heads_kv: Mapped[int] = mapped_column(Integer, nullable=False)
    seqlen_q: Mapped[int] = mapped_column(Integer, nullable=False)
    seqlen_k: Mapped[int] = mapped_column(Integer, nullable=False)
    head_dim: Mapped[int] = mapped_column(Integer, nullable=False)
    dtype: Mapped[str] = mapped_column(String(16), nullable=False)
    causal: Mapped[bool] = mapped_column(Boolean, nullable=False)
    causal_align: Mapped[str] = mapped_column(String(16), nullable=False)
    # Schema version 3: KV-cache and backward problems.
    kind: Mapped[str] = mapped_column(String(8), nullable=False, default="fwd", server_default="fwd")
    page_size: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")

    def to_problem(self) -> Problem:
        return Problem(self.batch, self.heads_q, self.heads_kv, self.seqlen_q, self.seqlen_k, self.head_dim,
                       self.dtype, self.causal, self.causal_align, self.kind, self.page_size)


class ConfigModel(Base):
    __tablename__ = "fa_configs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    hash: Mapped[str] = mapped_column(String(32), unique=True, nullable=False)
    name: Mapped[str] = mapped_column(String(160), nullable=False)
    # Candidate.canonical_json(): a kernel config's, with an FP8 recipe's non-default fields
    json: Mapped[str] = mapped_column(Text, nullable=False)

    def to_candidate(self, fp8: bool) -> Candidate | None:
        """The config (with its recipe, for an FP8 problem), or None where this version of
        fa_autotune no longer accepts it."""
        return Candidate.from_stored(self.json, fp8)


class MeasurementModel(Base):
    __tablename__ = "fa_measurements"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("fa_problems.id"), nullable=False, index=True)
    config_id: Mapped[int] = mapped_column(ForeignKey("fa_configs.id"), nullable=False, index=True)
    gpu_id: Mapped[int] = mapped_column(ForeignKey("fa_gpus.id"), nullable=False)
    software_id: Mapped[int] = mapped_column(ForeignKey("fa_software.id"), nullable=False)
    status: Mapped[str] = mapped_column(String(32), nullable=False, index=True)
    phase: Mapped[str] = mapped_column(String(16), nullable=False, default="search")  # search | retime
    median_ms: Mapped[float | None] = mapped_column(Float)
    p20_ms: Mapped[float | None] = mapped_column(Float)
    p80_ms: Mapped[float | None] = mapped_column(Float)
    tflops: Mapped[float | None] = mapped_column(Float)
    max_abs_error: Mapped[float | None] = mapped_column(Float)
    rel_error: Mapped[float | None] = mapped_column(Float)
    compile_seconds: Mapped[float | None] = mapped_column(Float)
    message: Mapped[str] = mapped_column(Text, nullable=False, default="")
    study_name: Mapped[str | None] = mapped_column(String(256))
    trial_number: Mapped[int | None] = mapped_column(Integer)
    started_at: Mapped[dt.datetime] = mapped_column(DateTime, default=_now)
    finished_at: Mapped[dt.datetime] = mapped_column(DateTime, default=_now)

    problem: Mapped[ProblemModel] = relationship()
    config: Mapped[ConfigModel] = relationship()
    gpu: Mapped[GpuModel] = relationship()
    software: Mapped[SoftwareModel] = relationship()


class BestModel(Base):
    """The winner of a problem on a GPU and software stack, after re-timing."""

    __tablename__ = "fa_best"
    __table_args__ = (UniqueConstraint("problem_id", "gpu_id", "software_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("fa_problems.id"), nullable=False)
    gpu_id: Mapped[int] = mapped_column(ForeignKey("fa_gpus.id"), nullable=False)
    software_id: Mapped[int] = mapped_column(ForeignKey("fa_software.id"), nullable=False)
    config_id: Mapped[int] = mapped_column(ForeignKey("fa_configs.id"), nullable=False)
    median_ms: Mapped[float] = mapped_column(Float, nullable=False)
    tflops: Mapped[float] = mapped_column(Float, nullable=False)
    rel_error: Mapped[float | None] = mapped_column(Float)
    ties: Mapped[int] = mapped_column(Integer, nullable=False, default=1)
    study_name: Mapped[str | None] = mapped_column(String(256))
    source: Mapped[str] = mapped_column(String(32), nullable=False, default="tune")  # tune | import
    decided_at: Mapped[dt.datetime] = mapped_column(DateTime, default=_now)

    problem: Mapped[ProblemModel] = relationship()
    config: Mapped[ConfigModel] = relationship()
    gpu: Mapped[GpuModel] = relationship()
    software: Mapped[SoftwareModel] = relationship()


class ParetoModel(Base):
    """One config on a problem's time/error Pareto front (FP8: where the accuracy a config
    gives up buys speed), as its last tune found it; added in schema version 2."""

    __tablename__ = "fa_pareto"
    __table_args__ = (UniqueConstraint("problem_id", "gpu_id", "software_id", "config_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("fa_problems.id"), nullable=False, index=True)
    gpu_id: Mapped[int] = mapped_column(ForeignKey("fa_gpus.id"), nullable=False)
    software_id: Mapped[int] = mapped_column(ForeignKey("fa_software.id"), nullable=False)
    config_id: Mapped[int] = mapped_column(ForeignKey("fa_configs.id"), nullable=False)
    median_ms: Mapped[float] = mapped_column(Float, nullable=False)
    tflops: Mapped[float] = mapped_column(Float, nullable=False)
    rel_error: Mapped[float] = mapped_column(Float, nullable=False)
    max_error: Mapped[float | None] = mapped_column(Float)  # the budget the front was built under
    study_name: Mapped[str | None] = mapped_column(String(256))
    decided_at: Mapped[dt.datetime] = mapped_column(DateTime, default=_now)

    problem: Mapped[ProblemModel] = relationship()
    config: Mapped[ConfigModel] = relationship()
    gpu: Mapped[GpuModel] = relationship()
    software: Mapped[SoftwareModel] = relationship()



class ClaimModel(Base):
    """A config one tune is measuring right now on a problem, GPU and software stack, so that
    workers sharing the database never measure it twice (schema version 3). Released once
    the measurement is stored; a claim whose owner is gone is taken over."""

    __tablename__ = "fa_claims"
    __table_args__ = (UniqueConstraint("problem_id", "gpu_id", "software_id", "config_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("fa_problems.id"), nullable=False)
    gpu_id: Mapped[int] = mapped_column(ForeignKey("fa_gpus.id"), nullable=False)
    software_id: Mapped[int] = mapped_column(ForeignKey("fa_software.id"), nullable=False)
    config_id: Mapped[int] = mapped_column(ForeignKey("fa_configs.id"), nullable=False)
    owner: Mapped[str] = mapped_column(String(200), nullable=False)  # host:run-id:pid
    claimed_at: Mapped[dt.datetime] = mapped_column(DateTime, default=_now)
