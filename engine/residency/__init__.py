"""Residency: the ledger of loaded components and the policy that places them (see manager.py)."""

from .events import KINDS, Event, EventLog
from .ledger import ComponentState, LedgerSnapshot, Policy
from .manager import Residency, default_probe

__all__ = [
    "KINDS",
    "ComponentState",
    "Event",
    "EventLog",
    "LedgerSnapshot",
    "Policy",
    "Residency",
    "default_probe",
]
