"""How many CPUs this process may run on: the one count the scan's worker processes and a load's
populate threads are sized by (plain Python, imported by the torch-free scan)."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """The CPUs the scheduler lets this process use (a container's or taskset's share), else all."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
