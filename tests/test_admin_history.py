"""Admin permissions and history: staff without a model's change permission cannot edit
tiers, rules or API keys, and every add, change, delete and revoke is in the admin history."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from django_throttle.models import ApiKey, EndpointRule, Tier, TierLimit
from tests.factories import endpoint, tier

pytestmark = pytest.mark.django_db

MODELS = ["tier", "endpointrule", "apikey"]
EMPTY_INLINE = {
    "limits-TOTAL_FORMS": "0",
    "limits-INITIAL_FORMS": "0",
    "limits-MIN_NUM_FORMS": "0",
    "limits-MAX_NUM_FORMS": "1000",
}


@pytest.fixture
def rows() -> dict[str, Any]:
    free = tier("free", "100/min", is_default_anonymous=True)
    rule = endpoint("export", "scope", "export")
    key, _ = ApiKey.objects.create_key(name="ci", tier=free)
    return {"tier": free, "endpointrule": rule, "apikey": key}


def staff(django_user_model: Any, *codenames: str) -> Client:
    """A logged-in staff user holding only ``codenames`` of django_throttle's permissions."""
    user = django_user_model.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_throttle", codename__in=codenames)
    )
    client = Client()
    client.force_login(user)
    return client


def change_data(model: str, row: Any) -> dict[str, str]:
    if model == "tier":
        return {
            "slug": row.slug,
            "name": "Renamed",
            "description": "",
            "priority": "0",
            "load_factor": "100",
            "min_factor": "10",
        } | (EMPTY_INLINE)
    if model == "endpointrule":
        return {
            "name": "renamed",
            "match_type": row.match_type,
            "pattern": row.pattern,
            "methods": "",
            "cost": "1",
            "counts": "all",
            "criticality": "default",
            "enabled": "on",
        } | EMPTY_INLINE
    return {"name": "renamed", "tier": str(row.tier_id), "owner": "", "active": "on"}


@pytest.mark.parametrize("model", MODELS)
def test_staff_without_any_permission_cannot_open_or_change(
    model: str, rows: dict[str, Any], django_user_model: Any
) -> None:
    client = staff(django_user_model)
    row = rows[model]
    url = reverse(f"admin:django_throttle_{model}_change", args=[row.pk])

    assert client.get(reverse(f"admin:django_throttle_{model}_changelist")).status_code == 403
    assert client.get(url).status_code == 403
    assert client.post(url, change_data(model, row)).status_code == 403
    assert client.post(reverse(f"admin:django_throttle_{model}_add"), {}).status_code == 403
    delete = reverse(f"admin:django_throttle_{model}_delete", args=[row.pk])
    assert client.post(delete, {"post": "yes"}).status_code == 403
    assert type(row).objects.filter(pk=row.pk).exists()
    assert not LogEntry.objects.exists()


@pytest.mark.parametrize("model", MODELS)
def test_staff_with_view_permission_only_can_read_but_not_change(
    model: str, rows: dict[str, Any], django_user_model: Any
) -> None:
    client = staff(django_user_model, f"view_{model}")
    row = rows[model]
    url = reverse(f"admin:django_throttle_{model}_change", args=[row.pk])

    assert client.get(url).status_code == 200  # read-only page
    assert client.post(url, change_data(model, row)).status_code == 403
    delete = reverse(f"admin:django_throttle_{model}_delete", args=[row.pk])
    assert client.post(delete, {"post": "yes"}).status_code == 403
    row.refresh_from_db()
    assert getattr(row, "name", "") != "renamed" and getattr(row, "name", "") != "Renamed"
    assert not LogEntry.objects.exists()


def test_staff_with_view_permission_cannot_revoke_keys(
    rows: dict[str, Any], django_user_model: Any
) -> None:
    client = staff(django_user_model, "view_apikey")
    key = rows["apikey"]

    client.post(
        reverse("admin:django_throttle_apikey_changelist"),
        {"action": "revoke", "_selected_action": [key.pk]},
    )

    key.refresh_from_db()
    assert key.active is True
    assert not LogEntry.objects.exists()


def test_staff_with_view_permission_cannot_use_the_rule_list_checkboxes(
    rows: dict[str, Any], django_user_model: Any
) -> None:
    """``enabled`` and ``shadow`` are editable in the list for those who may change rules."""
    client = staff(django_user_model, "view_endpointrule")
    rule = rows["endpointrule"]

    client.post(
        reverse("admin:django_throttle_endpointrule_changelist"),
        {
            "form-TOTAL_FORMS": "1",
            "form-INITIAL_FORMS": "1",
            "form-0-id": str(rule.pk),
            "form-0-shadow": "on",
            "_save": "Save",
        },
    )

    rule.refresh_from_db()
    assert rule.enabled is True and rule.shadow is False


def history(row: Any) -> list[tuple[int, str]]:
    """(action flag, change message) of ``row``'s admin history, oldest first."""
    return [
        (entry.action_flag, entry.get_change_message())
        for entry in LogEntry.objects.filter(object_id=str(row.pk)).order_by("pk")
        if entry.content_type.model_class() is type(row)
    ]


def test_tier_add_change_and_delete_are_in_the_history(admin_client: Client) -> None:
    add = {
        "slug": "pro",
        "name": "Pro",
        "description": "",
        "priority": "0",
        "load_factor": "100",
        "min_factor": "10",
    } | EMPTY_INLINE
    add |= {
        "limits-TOTAL_FORMS": "1",
        "limits-0-rate": "100/min",
        "limits-0-algorithm": "token_bucket",
        "limits-0-shared": "on",
    }
    admin_client.post(reverse("admin:django_throttle_tier_add"), add)
    pro = Tier.objects.get(slug="pro")
    limit = TierLimit.objects.get(tier=pro)
    assert limit.shared is True
    admin_client.post(
        reverse("admin:django_throttle_tier_change", args=[pro.pk]),
        change_data("tier", pro)
        | {
            "limits-TOTAL_FORMS": "1",
            "limits-INITIAL_FORMS": "1",
            "limits-0-id": str(limit.pk),
            "limits-0-tier": str(pro.pk),
            "limits-0-rate": "200/min",
            "limits-0-algorithm": "token_bucket",
        },
    )
    admin_client.post(reverse("admin:django_throttle_tier_delete", args=[pro.pk]), {"post": "yes"})

    assert not Tier.objects.filter(pk=pro.pk).exists()
    flags = [flag for flag, _ in history(pro)]
    assert flags == [ADDITION, CHANGE, DELETION]
    changed = history(pro)[1][1]
    assert "Name" in changed and "tier limit" in changed  # the inline row's change too


def test_rule_changes_in_the_form_and_the_list_are_in_the_history(
    admin_client: Client, rows: dict[str, Any]
) -> None:
    rule = rows["endpointrule"]
    admin_client.post(
        reverse("admin:django_throttle_endpointrule_change", args=[rule.pk]),
        change_data("endpointrule", rule),
    )
    admin_client.post(
        reverse("admin:django_throttle_endpointrule_changelist"),
        {
            "form-TOTAL_FORMS": "1",
            "form-INITIAL_FORMS": "1",
            "form-0-id": str(rule.pk),
            "form-0-enabled": "on",
            "form-0-shadow": "on",
            "_save": "Save",
        },
    )

    rule.refresh_from_db()
    assert rule.name == "renamed" and rule.shadow is True
    assert [flag for flag, _ in history(rule)] == [CHANGE, CHANGE]
    assert "Shadow" in history(rule)[1][1]


def test_api_key_add_revoke_and_delete_are_in_the_history(admin_client: Client) -> None:
    free = tier("free", "100/min")
    admin_client.post(
        reverse("admin:django_throttle_apikey_add"),
        {"name": "partner", "tier": str(free.pk), "owner": "", "active": "on"},
    )
    key = ApiKey.objects.get(name="partner")
    admin_client.post(
        reverse("admin:django_throttle_apikey_changelist"),
        {"action": "revoke", "_selected_action": [key.pk]},
    )
    admin_client.post(
        reverse("admin:django_throttle_apikey_delete", args=[key.pk]), {"post": "yes"}
    )

    assert [flag for flag, _ in history(key)] == [ADDITION, CHANGE, DELETION]
    assert "Active" in history(key)[1][1]
    page = admin_client.get(reverse("admin:django_throttle_tier_history", args=[free.pk]))
    assert page.status_code == 200


def test_the_history_page_lists_a_revoke(admin_client: Client, rows: dict[str, Any]) -> None:
    key = rows["apikey"]
    admin_client.post(
        reverse("admin:django_throttle_apikey_changelist"),
        {"action": "revoke", "_selected_action": [key.pk]},
    )

    page = admin_client.get(reverse("admin:django_throttle_apikey_history", args=[key.pk]))

    assert page.status_code == 200
    assert "Changed Active." in page.content.decode()
    assert EndpointRule.objects.count() == 1
