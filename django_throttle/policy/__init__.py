"""Compiled policy: the admin's rows compiled into an immutable snapshot, the snapshot
each process holds, who is calling, exemptions, and policies as files.

Knows no request path, DRF or admin."""
