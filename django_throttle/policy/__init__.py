"""Compiled policy: the admin's rows compiled into an immutable snapshot, the snapshot
each process holds, who is calling, exemptions, and policies as files.

Knows no request path, DRF or admin."""

#: Internal: nothing here is public API (the public faces are listed in the docs' Python
#: API reference), and it may move between releases.
__all__: list[str] = []
