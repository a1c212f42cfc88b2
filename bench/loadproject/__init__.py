"""A tiny Django project that ``bench/load_test.py`` serves under gunicorn and uvicorn."""
