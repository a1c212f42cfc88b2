"""How the token-bucket script writes its state, for tests that write state by hand.

Free of Django imports: spawned test processes import the test modules that use it.
"""

from __future__ import annotations


def base36(n: int) -> str:
    """A whole number in base 36: the script's stored µs timestamps."""
    digits = ""
    while True:
        n, digit = divmod(n, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[digit] + digits
        if not n:
            return digits
