"""The request path: plan, one backend call, finish; reservations and refunds, the
username a credential request presents, device cookies, and the response headers.

Imports no DRF and no admin."""
