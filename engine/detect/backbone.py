"""The backbone record the diffusion rules fill in, and how they find a backbone's key prefix."""

from __future__ import annotations

from dataclasses import dataclass, field

from .keys import KeyIndex
from .result import Evidence

# SGM/LDM checkpoints keep the backbone under this prefix; bare files have none.
PREFERRED_PREFIXES = ("model.diffusion_model.", "", "diffusion_model.", "model.", "unet.", "transformer.")


@dataclass
class Backbone:
    """What the rules found: the backbone's prefix, component name, architecture and why."""

    prefix: str
    component: str  # "unet" or "transformer"
    family: str
    architecture: str | None = None
    variant: str | None = "normal"
    prediction: str | None = None
    evidence: list[Evidence] = field(default_factory=list)
    also: list[str] = field(default_factory=list)  # other families whose releases share this layout

    def because(self, ix: KeyIndex, key: str, reason: str) -> None:
        self.evidence.append(Evidence(key, ix.shape(key), reason))


def pick_prefix(ix: KeyIndex, suffix: str, also: tuple[str, ...] = ()) -> str | None:
    """The prefix under which `suffix` (and every key of `also`) exists, preferring the usual ones.
    EMA copies, ControlNet halves and VAEs inside checkpoints are never a backbone."""
    cands = [p for p in ix.prefixes_for(suffix) if all(ix.has(p + a) for a in also)]
    cands = [p for p in cands if not p.startswith(("model_ema.", "control_model.", "first_stage_model."))]
    if not cands:
        return None
    for p in PREFERRED_PREFIXES:
        if p in cands:
            return p
    return min(cands, key=len)
