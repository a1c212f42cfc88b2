"""What to try in the demo, written once: ``run_demo`` prints it in its banner and the demo's
home page (``/``) shows it, so a newcomer who opens http://127.0.0.1:8000 in a browser meets
the same list as one who reads the terminal, instead of a bare "Not Found"."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from example_project.load import SIGNAL as DEMO_SIGNAL

#: Where the home page's list puts the API key, which is shown only when it is made.
KEY_PLACEHOLDER = "<the API key run_demo printed>"


def typed_python() -> str:
    """This interpreter as a newcomer would type it here (``.venv/bin/python``)."""
    executable = Path(sys.executable)
    try:
        return str(executable.relative_to(Path.cwd()))
    except ValueError:
        return str(executable)


def try_lines(base: str, api_key: str, python: str) -> str:
    """The curl lines to try against the demo at ``base`` (no trailing slash), each under a
    comment saying what it shows; ``python`` is the interpreter as the reader would type it."""
    loop = f"for i in $(seq 12); do curl -s -o /dev/null -w '%{{http_code}} ' {base}/api/ping/"
    paced = (
        "for i in $(seq 7); do curl -s -o /dev/null -w '%{http_code} %{time_total}s\\n' "
        f"{base}/api/search/?q=tea & done; wait"
    )
    brazil = (
        "for i in $(seq 7); do curl -s -o /dev/null -w '%{http_code} ' "
        f"-H 'CF-IPCountry: BR' {base}/api/ping/"
    )
    return textwrap.dedent(
        f"""\
        # anonymous: token bucket of 10, refilling 2 a second -> 10 x 200, then 429
        {loop}; done; echo

        # X-RateLimit-* headers; Retry-After when refused
        curl -i {base}/api/ping/

        # alice's own bucket (tier free: 60/min)
        curl -i -u alice:alice {base}/api/items/

        # costs 10 tokens of free's 20/h export limit: the third call in a row is refused
        curl -i -u alice:alice -X POST {base}/api/export/

        # one download at a time (free: a concurrency limit): while this one streams
        # for 10 s, the same line in a third terminal gets 429 with Retry-After: 1
        curl -i -u alice:alice "{base}/api/export/download/?seconds=10"

        # paced, not refused (GCRA with a delay): 3 at once, the next 3 half a second
        # apart (see X-RateLimit-Delayed), the 7th refused
        {paced}

        # a plain Django view with @throttle(rate="5/min")
        curl -i {base}/hello/

        # an API key of tier partner (300/min): its own bucket, whatever the address
        curl -i -H "X-API-Key: {api_key}" {base}/api/ping/

        # a regional limit: from Brazil (CF-IPCountry, believed from the demo's edge
        # proxy, this machine), anonymous clients get 5 refilling 1 a second -> 5 x 200
        {brazil}; done; echo

        # adaptive limits: report twice the target load; each step shrinks anonymous
        # (then free) down to its floor: the first anonymous loop above now stops at 7.
        # DEMO_LOAD=0.5 gives the tiers back, --clear at once; see the admin's Dashboard
        DEMO_LOAD=2 {python} manage.py throttle_adapt --signal {DEMO_SIGNAL} --once
        """
    )
