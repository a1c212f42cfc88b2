"""What tier assignments compiled into the policy snapshot cost: compile time, memory per
assigned user, and the cost of one ``tier_for`` lookup, for a million assigned users.

Run from the repository root::

    .venv/bin/python bench/bench_assignments.py [--users 1000000] [--lookups 200000] [--json]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
        .venv/bin/python bench/bench_assignments.py

The data lives in a throwaway database this script creates and drops: a SQLite file in a
temporary directory, or, with ``DATABASE_URL`` (PostgreSQL), a new database ``dt_bench_<random>``
on that server (the URL's own database is only used to run CREATE/DROP DATABASE). Rows are
written with ``bulk_create``, as a bulk import would: ``--users`` assigned users, half with an
assignment of their own (a tenth of those also in a tiered group: their own wins), half through
one or two of ten tiered groups, plus a tenth as many unassigned users. No Redis is needed.

Reported: compile time of the whole policy (median of ``--repeat`` compiles) and its SQL query
count; bytes per assigned user the index holds (``tracemalloc``, in a separate compile because
tracing slows it) next to a plain dict of the same answers; the peak extra memory while
compiling; and the mean cost of ``Policy.tier_for`` over ``--lookups`` distinct users in random
order (assigned and unassigned), next to a dict lookup.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BATCH = 20_000
GROUPS = 10


@contextmanager
def throwaway_database(url: str | None) -> Iterator[dict[str, Any]]:
    """Django DATABASES['default'] for a database created here and dropped on exit."""
    if not url:
        folder = tempfile.mkdtemp(prefix="dt-bench-")
        try:
            yield {"ENGINE": "django.db.backends.sqlite3", "NAME": f"{folder}/bench.sqlite3"}
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return
    import dj_database_url
    import psycopg

    config = dj_database_url.parse(url)
    if "postgresql" not in config["ENGINE"]:
        raise SystemExit("DATABASE_URL must be a PostgreSQL URL (or unset for SQLite)")
    name = f"dt_bench_{uuid.uuid4().hex[:12]}"
    admin = psycopg.connect(url, autocommit=True)
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield {**config, "NAME": name}
    finally:
        from django.db import connections

        connections.close_all()
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.close()


def configure(database: dict[str, Any]) -> None:
    import django
    from django.conf import settings

    settings.configure(
        DEBUG=False,
        SECRET_KEY="bench-only-not-secret",
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        DATABASES={"default": database},
        INSTALLED_APPS=["django.contrib.auth", "django.contrib.contenttypes", "django_throttle"],
        DJANGO_THROTTLE_REDIS_URL="memory://",
    )
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def populate(assigned: int) -> int:
    """Write the users, groups and assignments; returns the highest user id."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from django_throttle.models import Tier, TierAssignment, TierLimit

    user_model = get_user_model()
    tiers = []
    for i, slug in enumerate(("free", "pro", "team", "gold", "internal")):
        row = Tier.objects.create(
            slug=slug, name=slug.title(), priority=i, is_default_authenticated=slug == "free"
        )
        TierLimit.objects.create(tier=row, rate=f"{(i + 1) * 100}/m")
        tiers.append(row)
    groups = [Group.objects.create(name=f"tiered-{i}") for i in range(GROUPS)]
    TierAssignment.objects.bulk_create(
        TierAssignment(group=group, tier=tiers[1 + i % 4]) for i, group in enumerate(groups)
    )
    total = assigned + assigned // 10
    through = user_model.groups.through
    for start in range(0, total, BATCH):
        stop = min(start + BATCH, total)
        users = user_model.objects.bulk_create(
            user_model(username=f"u{i}", password="!") for i in range(start, stop)
        )
        own, members = [], []
        for i, user in zip(range(start, stop), users, strict=True):
            if i >= assigned:
                continue  # unassigned
            if i % 2 == 0:
                own.append(TierAssignment(user_id=user.pk, tier=tiers[1 + i % 4]))
                if i % 20 == 0:
                    members.append(through(user_id=user.pk, group_id=groups[i % GROUPS].pk))
            else:
                members.append(through(user_id=user.pk, group_id=groups[i % GROUPS].pk))
                if i % 3 == 0:
                    members.append(through(user_id=user.pk, group_id=groups[(i + 1) % GROUPS].pk))
        TierAssignment.objects.bulk_create(own, batch_size=BATCH)
        through.objects.bulk_create(members, batch_size=BATCH)
        print(f"\r  populated {stop:,} / {total:,} users", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return int(user_model.objects.order_by("-pk").values_list("pk", flat=True)[0])


def measure(assigned: int, lookups: int, repeat: int) -> dict[str, Any]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_throttle.identity import Identity
    from django_throttle.policy import live as policy

    started = time.perf_counter()
    highest = populate(assigned)
    populate_s = time.perf_counter() - started

    times = []
    snapshot = None
    for _ in range(repeat):
        snapshot = None
        gc.collect()
        started = time.perf_counter()
        snapshot = policy.compile_policy()
        times.append(time.perf_counter() - started)
    assert snapshot is not None
    with CaptureQueriesContext(connection) as queries:
        policy.compile_policy()
    index_size = len(snapshot.user_tiers)

    # Memory: what the index holds, and the peak while compiling (a traced, slower compile).
    snapshot = None
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    traced = policy.compile_policy()
    current, peak = tracemalloc.get_traced_memory()
    held = sum(
        stat.size
        for stat in tracemalloc.take_snapshot()
        .filter_traces([tracemalloc.Filter(True, policy.__file__)])
        .statistics("filename")
    )
    tracemalloc.stop()
    snapshot = traced

    # The same answers as a dict, for comparison.
    rng = random.Random(6)
    sample_ids = rng.sample(range(1, highest + 1), min(lookups, highest))
    answers = {}
    ids = snapshot.user_tiers.ids
    if ids is not None:
        slots, tier_ids = snapshot.user_tiers.slots, snapshot.user_tiers.tier_ids
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        answers = {int(uid): tier_ids[slot] for uid, slot in zip(ids, slots, strict=True)}  # type: ignore[arg-type]
        dict_bytes = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
    else:
        dict_bytes = 0

    identities = [Identity("user", str(uid), user_id=uid) for uid in sample_ids]
    tier_for = snapshot.tier_for
    best_tier_for = best_dict = best_empty = float("inf")
    for _ in range(5):  # best of five: noise only ever adds time
        started = time.perf_counter()
        for identity in identities:
            tier_for(identity)
        best_tier_for = min(best_tier_for, time.perf_counter() - started)
        started = time.perf_counter()
        for uid in sample_ids:
            answers.get(uid)
        best_dict = min(best_dict, time.perf_counter() - started)
        started = time.perf_counter()
        for _uid in sample_ids:
            pass
        best_empty = min(best_empty, time.perf_counter() - started)
    found = sum(1 for identity in identities if snapshot.user_tiers.get(identity.user_id))
    n = len(identities)
    return {
        "database": connection.vendor,
        "assigned_users": index_size,
        "users_total": highest,
        "populate_s": round(populate_s, 1),
        "compile_s_median": round(statistics.median(times), 3),
        "compile_s_all": [round(t, 3) for t in times],
        "compile_queries": len(queries.captured_queries),
        "index_bytes_per_user": round(held / index_size, 2) if index_size else None,
        "dict_bytes_per_user": round(dict_bytes / index_size, 1) if dict_bytes else None,
        "compile_peak_extra_mb": round((peak - base) / 2**20, 1),
        "kept_after_compile_mb": round((current - base) / 2**20, 1),
        "lookups": n,
        "lookups_assigned": found,
        "tier_for_us": round((best_tier_for - best_empty) / n * 1e6, 3),
        "dict_get_us": round((best_dict - best_empty) / n * 1e6, 3),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=1_000_000, help="assigned users")
    parser.add_argument("--lookups", type=int, default=200_000, help="distinct users looked up")
    parser.add_argument("--repeat", type=int, default=3, help="timed compiles")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    with throwaway_database(os.environ.get("DATABASE_URL")) as database:
        configure(database)
        result = measure(args.users, args.lookups, args.repeat)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    rows = (
        ("database", result["database"]),
        ("assigned users (direct + via groups)", f"{result['assigned_users']:,}"),
        ("users in the database", f"{result['users_total']:,}"),
        ("compile time, whole policy (median)", f"{result['compile_s_median']} s"),
        ("SQL queries per compile", result["compile_queries"]),
        ("index bytes per assigned user", result["index_bytes_per_user"]),
        ("same answers as a dict, bytes per user", result["dict_bytes_per_user"]),
        ("peak extra memory while compiling", f"{result['compile_peak_extra_mb']} MiB"),
        ("tier_for, distinct users, per lookup", f"{result['tier_for_us']} µs"),
        ("dict.get, same users, per lookup", f"{result['dict_get_us']} µs"),
    )
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")


if __name__ == "__main__":
    main()
