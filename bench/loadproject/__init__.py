"""A tiny Django project that ``bench/load_test.py`` and ``bench/load_concurrency.py`` serve under
gunicorn (and load_test.py and ``bench/load_delay.py`` under uvicorn)."""

#: The Redis counter of export requests inside the view: the workers the slow endpoint holds.
IN_FLIGHT_KEY = "lt-inflight:export"
