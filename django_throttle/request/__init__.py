"""The request path: plan, one backend call, finish; reservations and refunds, the
username a credential request presents, device cookies, and the response headers.

Imports no DRF and no admin.

Internal: nothing here is public API (the public faces are in the docs' Python API
reference), and it may change between releases.
"""
