"""What the operator tools (the admin's inspector, ``throttle_inspect``,
``throttle_explain``, ``throttle_reset``) ask about one client, answered by the
request path's own planning."""
