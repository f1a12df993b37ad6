"""What a run records keeps no secret: :func:`nre_ray.core.redact.redact` on MLflow params and tags and on a
checkpoint's configuration."""

from __future__ import annotations

import secrets

from nre_ray.core.redact import HIDDEN, redact


def test_a_uri_password_and_the_environments_secrets_are_hidden(monkeypatch, tmp_path):
    password, token, key = secrets.token_urlsafe(16), secrets.token_hex(32), secrets.token_urlsafe(30)
    token_file = tmp_path / "token"
    token_file.write_text(token)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token_file))
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    config = {"run": {"tracking_uri": "https://admin:pw-in-the-uri@mlflow.example:5000",
                      "note": f"token {token}, key {key}", "epochs": 3, "tags": [f"p={password}", "plain"]}}
    shown = redact(config)
    assert shown == {"run": {"tracking_uri": f"https://admin:{HIDDEN}@mlflow.example:5000",
                             "note": f"token {HIDDEN}, key {HIDDEN}", "epochs": 3, "tags": [f"p={HIDDEN}", "plain"]}}
    assert redact("s3://bucket/nre_ray/data") == "s3://bucket/nre_ray/data"  # nothing secret: as it is
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
    assert password in redact(f"p={password}")  # hidden only while it is this process's secret
