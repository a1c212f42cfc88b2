"""Compiled policy: the admin's rows compiled into an immutable snapshot, the snapshot
each process holds, who is calling, exemptions, and policies as files.

Knows no request path, DRF or admin.

Internal: nothing here is public API (the public faces are in the docs' Python API
reference), and it may change between releases.
"""
