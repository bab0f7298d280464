"""The planner's verdict for a load as it will be asked: the model's header, its draft's, these settings."""
from __future__ import annotations

from ggufdesk.core import planner
from ggufdesk.core.errors import KnownError
from ggufdesk.core.gguf_meta import GGUFInfo, read_gguf
from ggufdesk.core.hardware import HardwareInfo
from ggufdesk.core.projector import ProjectorInfo, projector_beside, read_projector
from ggufdesk.core.settings import LoadSettings, SpeculationSettings


def plan_load(model: str, load: LoadSettings, speculation: SpeculationSettings,
              hw: HardwareInfo) -> tuple[GGUFInfo, planner.Plan]:
    """(the model's header, the plan); KnownError for an unreadable model or draft file."""
    info = read_gguf(model)
    draft = None
    if speculation.mode == "draft" and speculation.draft_model:
        try:
            draft = read_gguf(speculation.draft_model)
        except KnownError as e:
            raise KnownError(f"the draft model cannot be used: {e}") from None
    return info, planner.plan(info, hw, n_ctx=load.n_ctx, draft=draft, type_k=load.type_k, type_v=load.type_v,
                              n_gpu_layers=load.n_gpu_layers, n_ubatch=load.n_ubatch, flash_attn=load.flash_attn,
                              n_cpu_moe=load.n_cpu_moe, projector=_projector(model))


def _projector(model: str) -> ProjectorInfo | None:
    """The projector the engine will load beside the model (None: none, or one it would refuse)."""
    path = projector_beside(model) if not model.startswith("hf://") else None
    if path is None:
        return None
    try:
        return read_projector(path)
    except KnownError:
        return None  # the engine refuses it too, and the model reads text only
