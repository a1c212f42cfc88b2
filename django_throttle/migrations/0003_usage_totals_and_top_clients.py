# Usage rows become two kinds: tier x endpoint totals (client "*") and per-client rows
# (tier and endpoint "*"), as the rollup writes them. Rows the old flusher wrote (one per
# minute, client, tier and endpoint) are summed into both kinds, so reports keep them.

from django.db import migrations, models

OUTCOMES = ("allowed", "denied", "shadow_denied", "failed_open", "failed_closed")
ALL = "*"


def split_old_rows(apps, schema_editor):
    alias = schema_editor.connection.alias
    UsageCount = apps.get_model("django_throttle", "UsageCount")
    rows = UsageCount.objects.using(alias)
    old = rows.exclude(client=ALL).exclude(tier=ALL, endpoint=ALL)
    sums = {f"n_{o}": models.Sum(o) for o in OUTCOMES}
    new = []
    for group, fields in (
        (("window_start", "tier", "endpoint"), {"client": ALL}),
        (("window_start", "client"), {"tier": ALL, "endpoint": ALL}),
    ):
        for row in old.values(*group).annotate(**sums).order_by().iterator():
            values = {o: row[f"n_{o}"] or 0 for o in OUTCOMES}
            new.append(UsageCount(**{k: row[k] for k in group}, **fields, **values))
    old.delete()
    rows.bulk_create(new, batch_size=500)


class Migration(migrations.Migration):

    dependencies = [
        ('django_throttle', '0002_bounds_failure_modes_usage_outcomes'),
    ]

    operations = [
        migrations.AlterField(
            model_name='usagecount',
            name='client',
            field=models.CharField(help_text="e.g. 'user:42', 'ip:203.0.113.7'; '*' on a tier and endpoint total", max_length=200),
        ),
        migrations.AlterField(
            model_name='usagecount',
            name='endpoint',
            field=models.CharField(blank=True, help_text="endpoint rule name or scope; '*' on a per-client row", max_length=100),
        ),
        migrations.AlterField(
            model_name='usagecount',
            name='tier',
            field=models.CharField(blank=True, help_text="tier slug; '*' on a per-client row", max_length=100),
        ),
        migrations.RunPython(split_old_rows, migrations.RunPython.noop),
    ]
