"""What the operator tools (the admin's inspector, ``throttle_inspect``,
``throttle_explain``, ``throttle_reset``) ask about one client, answered by the
request path's own planning."""

#: Internal: nothing here is public API (the public faces are listed in the docs' Python
#: API reference), and it may move between releases.
__all__: list[str] = []
