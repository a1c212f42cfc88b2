"""Login views routed with and without ``protect_credentials`` (the unguarded login view
check, W016): DRF's browsable-API login and the admin's, unguarded; Django's auth URLs with
their login guarded before them; a ``LoginView`` under ``@throttle``."""

from django.contrib import admin
from django.contrib.auth.views import LoginView
from django.urls import include, path
from django.utils.decorators import method_decorator

from django_throttle.credentials import protect_credentials
from django_throttle.decorators import throttle


@method_decorator(throttle(scope="login"), name="dispatch")
class ThrottledLogin(LoginView):
    pass


urlpatterns = [
    path("admin/", admin.site.urls),
    path("api-auth/", include("rest_framework.urls")),
    path("accounts/login/", protect_credentials(LoginView.as_view())),
    path("accounts/", include("django.contrib.auth.urls")),
    path("throttled/login/", ThrottledLogin.as_view()),
]
