"""What the operator tools (the admin's inspector, ``throttle_inspect``,
``throttle_explain``, ``throttle_reset``) ask about one client, answered by the
request path's own planning.

Internal: nothing here is public API (the public faces are in the docs' Python API
reference), and it may change between releases.
"""
