"""Views held by a concurrency limit, for tests/test_concurrency_processes.py's WSGI server
(``ROOT_URLCONF = "tests.concurrency_views"``): one that raises, one that streams, one that
blocks. Each view has its own limit of 3 requests in flight per client, on leases of 5 s."""

from __future__ import annotations

import time
from collections.abc import Iterator

from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.urls import path

from django_throttle import decorators
from django_throttle.decorators import throttle
from django_throttle.rates import Limit

RATE = "3/5s"
ALGORITHM = "concurrency"


@throttle(rate=RATE, algorithm=ALGORITHM)
def raises(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("the view failed while it held a slot")


@throttle(rate=RATE, algorithm=ALGORITHM)
def streams(request: HttpRequest) -> StreamingHttpResponse:
    """``?chunks=N`` chunks (default: enough to outlast any test), one every 20 ms."""
    chunks = int(request.GET.get("chunks", "1000"))

    def content() -> Iterator[bytes]:
        for n in range(chunks):
            yield b"chunk %d\n" % n
            time.sleep(0.02)

    return StreamingHttpResponse(content(), content_type="text/plain")


@throttle(rate=RATE, algorithm=ALGORITHM)
def blocks(request: HttpRequest) -> HttpResponse:
    """Answers after ``?seconds=`` (default: longer than any test waits for it)."""
    time.sleep(float(request.GET.get("seconds", "120")))
    return HttpResponse(b"done")


def limit_of(view_name: str) -> Limit:
    """The inline limit ``@throttle`` built for the view named ``view_name`` here (its key
    is ``backend.key(client, limit_of(...))``)."""
    owner = f"{__name__}.{view_name}"
    probe = decorators._probe(RATE, None, ALGORITHM, "")
    return decorators._inline_limits(owner, probe, None, None, "")[0]


urlpatterns = [
    path("raises/", raises),
    path("streams/", streams),
    path("blocks/", blocks),
]
