"""The demo's load signal, the load as a ratio to its target as an operator sets it in the
controller's environment: ``manage.py throttle_adapt --signal example_project.load.demo_load``
(:data:`SIGNAL`).

``DEMO_LOAD=2`` says "twice the target load" (each step shrinks the lowest-priority tier
still above its floor), ``DEMO_LOAD=0.5`` "half of it" (each step gives a tier back, highest
priority first), ``DEMO_LOAD=1`` holds; unset, there is no data and the factors hold. A real
signal reads the fleet's latency or error rate from your metrics (docs/howto/adaptive.md).
"""

from __future__ import annotations

import os

#: The environment variable an operator sets.
VARIABLE = "DEMO_LOAD"
#: What the demo gives ``manage.py throttle_adapt --signal``: the dotted path of :func:`demo_load`.
SIGNAL = "example_project.load.demo_load"


def demo_load() -> float | None:
    """``DEMO_LOAD`` as a number, ``None`` when unset or empty. A value that is not a number
    of at least 0 raises ``ValueError`` naming the variable: the controller logs it and holds
    the factors (it never moves them on a bad value)."""
    text = os.environ.get(VARIABLE, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{VARIABLE}={text!r} is not a number (e.g. 2 or 0.5)") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{VARIABLE}={text!r} must be a finite number of at least 0")
    return value
