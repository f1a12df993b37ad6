"""Secrets kept out of what a run records: MLflow params and tags, and the configuration a checkpoint keeps.

Credentials reach nre_ray only through the standard variables (``AWS_SECRET_ACCESS_KEY``, ``RAY_AUTH_TOKEN``,
``MLFLOW_TRACKING_PASSWORD``, ...) and files they name, never through flags; but a URI may carry a password
(``https://user:password@host``) and a value may repeat a variable's secret. :func:`redact` hides both.
"""

from __future__ import annotations

import os
import re
from typing import Any

#: The variables whose values are secrets (credentials of the object store, Ray's token, MLflow's password).
SECRET_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "RAY_AUTH_TOKEN", "MLFLOW_TRACKING_PASSWORD",
                    "MLFLOW_TRACKING_TOKEN", "MLFLOW_AUTH_ADMIN_PASSWORD")
#: What a secret is replaced with.
HIDDEN = "***"
#: The password of a URI's user part: ``scheme://user:PASSWORD@host``.
URI_PASSWORD = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*:)[^/\s@]+@")


def secrets_in_environment() -> list[str]:
    """The values of :data:`SECRET_VARIABLES` set in this process, and the Ray token of ``RAY_AUTH_TOKEN_PATH``
    (a short value is left out: it would hide ordinary words)."""
    values = [os.environ.get(name, "") for name in SECRET_VARIABLES]
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if path:
        try:
            with open(path, encoding="utf-8") as token:
                values.append(token.read().strip())
        except OSError:
            pass
    return [v for v in values if len(v) >= 8]


def redact(value: Any) -> Any:
    """``value`` with every secret hidden: a string's URI passwords and environment secrets
    (:func:`secrets_in_environment`), the strings of a dict, list or tuple in the same way; anything else as it
    is."""
    return _hidden(value, secrets_in_environment())


def _hidden(value: Any, secrets: list[str]) -> Any:
    if isinstance(value, dict):
        return {k: _hidden(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_hidden(v, secrets) for v in value)
    if not isinstance(value, str):
        return value
    text = URI_PASSWORD.sub(rf"\g<1>{HIDDEN}@", value)
    for secret in secrets:
        text = text.replace(secret, HIDDEN)
    return text
