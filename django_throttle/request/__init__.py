"""The request path: plan, one backend call, finish; reservations and refunds, the
username a credential request presents, device cookies, and the response headers.

Imports no DRF and no admin."""

#: Internal: nothing here is public API (the public faces are listed in the docs' Python
#: API reference), and it may move between releases.
__all__: list[str] = []
