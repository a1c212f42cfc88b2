"""django-throttle: rate limits for Django and DRF, managed in the admin, counted in Redis."""

__version__ = "0.1.0"
