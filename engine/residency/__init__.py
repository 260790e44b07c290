"""Residency: the ledger of loaded components and the policy that places them (see manager.py)."""

from .ledger import ComponentState, LedgerSnapshot, Policy
from .manager import Residency, default_probe

__all__ = [
    "ComponentState",
    "LedgerSnapshot",
    "Policy",
    "Residency",
    "default_probe",
]
