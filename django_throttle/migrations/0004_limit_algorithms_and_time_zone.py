# Limits pick one of seven algorithms, and a calendar quota counts in a time zone (empty = the
# TIME_ZONE setting). Existing rows keep the token bucket and get an empty time zone; the
# choices and help texts change no column.

import django.core.validators
import django_throttle.models.fields
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_throttle", "0003_usage_totals_and_top_clients"),
    ]

    operations = [
        migrations.AddField(
            model_name="endpointlimit",
            name="timezone",
            field=models.CharField(
                blank=True,
                default="",
                help_text="calendar quota only: where its days start, as an IANA name such as 'Europe/Berlin'; empty = the TIME_ZONE setting",
                max_length=64,
                verbose_name="time zone",
            ),
        ),
        migrations.AddField(
            model_name="tierlimit",
            name="timezone",
            field=models.CharField(
                blank=True,
                default="",
                help_text="calendar quota only: where its days start, as an IANA name such as 'Europe/Berlin'; empty = the TIME_ZONE setting",
                max_length=64,
                verbose_name="time zone",
            ),
        ),
        migrations.AlterField(
            model_name="endpointlimit",
            name="algorithm",
            field=models.CharField(
                choices=[
                    ("token_bucket", "Token bucket"),
                    ("gcra", "GCRA"),
                    ("leaky_bucket", "Leaky bucket"),
                    ("fixed_window", "Fixed window"),
                    ("sliding_window_log", "Sliding window log"),
                    ("sliding_window_counter", "Sliding window counter"),
                    ("calendar_quota", "Calendar quota"),
                ],
                default="token_bucket",
                help_text="how requests are counted: token bucket, GCRA and leaky bucket allow a burst; the window algorithms allow the rate's count per window; the calendar quota counts per calendar day, week, month or year",
                max_length=32,
            ),
        ),
        migrations.AlterField(
            model_name="endpointlimit",
            name="burst",
            field=models.IntegerField(
                blank=True,
                error_messages={
                    "max_value": "The burst must be at most %(limit_value)s.",
                    "min_value": "The burst must be at least %(limit_value)s.",
                },
                help_text="token bucket, GCRA and leaky bucket only: how many requests may come at once (the leaky bucket's queue size); empty = the rate's count",
                null=True,
                validators=[
                    django.core.validators.MinValueValidator(1),
                    django.core.validators.MaxValueValidator(1000000000),
                ],
            ),
        ),
        migrations.AlterField(
            model_name="endpointlimit",
            name="rate",
            field=models.CharField(
                help_text="requests per period, e.g. '100/min', '10/s', '5000/day' or '20/15m'; '10000/month' or '/year' with the calendar quota",
                max_length=32,
                validators=[django_throttle.models.fields.validate_rate],
            ),
        ),
        migrations.AlterField(
            model_name="tierlimit",
            name="algorithm",
            field=models.CharField(
                choices=[
                    ("token_bucket", "Token bucket"),
                    ("gcra", "GCRA"),
                    ("leaky_bucket", "Leaky bucket"),
                    ("fixed_window", "Fixed window"),
                    ("sliding_window_log", "Sliding window log"),
                    ("sliding_window_counter", "Sliding window counter"),
                    ("calendar_quota", "Calendar quota"),
                ],
                default="token_bucket",
                help_text="how requests are counted: token bucket, GCRA and leaky bucket allow a burst; the window algorithms allow the rate's count per window; the calendar quota counts per calendar day, week, month or year",
                max_length=32,
            ),
        ),
        migrations.AlterField(
            model_name="tierlimit",
            name="burst",
            field=models.IntegerField(
                blank=True,
                error_messages={
                    "max_value": "The burst must be at most %(limit_value)s.",
                    "min_value": "The burst must be at least %(limit_value)s.",
                },
                help_text="token bucket, GCRA and leaky bucket only: how many requests may come at once (the leaky bucket's queue size); empty = the rate's count",
                null=True,
                validators=[
                    django.core.validators.MinValueValidator(1),
                    django.core.validators.MaxValueValidator(1000000000),
                ],
            ),
        ),
        migrations.AlterField(
            model_name="tierlimit",
            name="rate",
            field=models.CharField(
                help_text="requests per period, e.g. '100/min', '10/s', '5000/day' or '20/15m'; '10000/month' or '/year' with the calendar quota",
                max_length=32,
                validators=[django_throttle.models.fields.validate_rate],
            ),
        ),
    ]
