"""Debug pages, error reports and log lines without Redis passwords.

Django's :class:`~django.views.debug.SafeExceptionReporterFilter` hides settings whose *name*
looks secret (``PASSWORD``, ``KEY``…), but not ``DJANGO_THROTTLE_REDIS_URL`` or a cache's
``LOCATION``, whose password sits inside a URL, nor the ``REDIS_URL`` environment variable
that the development server copies into every request's ``META``, nor an exception message
or a traceback variable holding such a URL. So the demo masks the password of every URL in
what it renders and logs, whatever the name it comes under:

- :class:`RedactingExceptionReporter` (``DEFAULT_EXCEPTION_REPORTER``): the debug page and the
  error e-mails, HTML and text;
- :class:`RedactingLogFilter` (on the console handler in ``LOGGING``): log messages and the
  tracebacks logged with them.

Copy them to your project if you show or log anything that may hold a Redis URL.
"""

from __future__ import annotations

import logging

from django.utils.safestring import SafeString, mark_safe
from django.views.debug import ExceptionReporter

from django_throttle.redaction import redact_text

__all__ = ["RedactingExceptionReporter", "RedactingLogFilter"]


class RedactingExceptionReporter(ExceptionReporter):
    """:class:`ExceptionReporter` whose pages and texts have every URL password masked."""

    # Masking changes only the text of URLs, never markup, so the pages stay safe.
    def get_traceback_html(self) -> SafeString:
        return mark_safe(redact_text(super().get_traceback_html()))

    def get_traceback_text(self) -> SafeString:
        return mark_safe(redact_text(super().get_traceback_text()))


class RedactingLogFilter(logging.Filter):
    """Mask URL passwords in a record's message and traceback before any handler formats it.

    The message is formatted here (``record.getMessage()``) and its arguments dropped, so a
    URL passed as an argument is masked too; the traceback is formatted once into
    ``record.exc_text``, which formatters use as it is.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact_text(record.getMessage())
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        if record.stack_info:
            record.stack_info = redact_text(record.stack_info)
        return True
