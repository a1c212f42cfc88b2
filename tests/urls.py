from django.contrib import admin
from django.urls import path

from tests import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/ping/", views.Ping.as_view(), name="ping"),
    path("api/export/", views.Export.as_view(), name="export"),
    path("api/reports/<int:pk>/", views.Ping.as_view(), name="report"),
    # One class, two scopes (tests/test_drf.py).
    path("api/scoped-a/", views.Scoped.as_view(throttle_scope="scoped-a")),
    path("api/scoped-b/", views.Scoped.as_view(throttle_scope="scoped-b")),
    path("api/scoped-async-a/", views.ScopedAsync.as_view(throttle_scope="scoped-a")),
    path("api/scoped-async-b/", views.ScopedAsync.as_view(throttle_scope="scoped-b")),
    path("hello/", views.hello, name="hello"),
    path("hello-async/", views.hello_async, name="hello-async"),
    path("login/", views.login, name="login"),
    path("login-closed/", views.login_closed, name="login-closed"),
    path("accounts/login/", views.ThrottledLogin.as_view(), name="django-login"),
    path("api/token/", views.TokenLogin.as_view(), name="token"),
    path("cbv/", views.ClassBased.as_view(), name="cbv"),
    path("cbv-a/", views.UnscopedA.as_view(), name="cbv-a"),
    path("cbv-b/", views.UnscopedB.as_view(), name="cbv-b"),
    # tests/test_request_seams.py
    path("seams/view/", views.seam_view),
    path("seams/view-async/", views.seam_view_async),
    path("seams/api/", views.SeamApi.as_view()),
    path("seams/api-async/", views.SeamAsyncApi.as_view()),
    path("seams/login/", views.seam_login),
    path("seams/login-async/", views.seam_login_async),
    path("seams/login-decorated/", views.seam_login_decorated),
    path("seams/login-decorated-async/", views.seam_login_decorated_async),
    path("seams/token/", views.SeamToken.as_view()),
    path("seams/token-async/", views.SeamAsyncToken.as_view()),
    path("seams/basic/", views.SeamBasic.as_view()),
]
