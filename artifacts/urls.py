"""Credentials never travel inside a URL.

A URL's userinfo (`scheme://user:password@host`, or `scheme://token@host`) ends up wherever the URL goes: the
stored recipe.json, Prefect flow-run parameters, botocore's error messages. So a recipe refuses any string
holding one, with a message naming the field and where the credentials belong instead, and never the value.
"""

from __future__ import annotations

import re
from typing import Any

# scheme://<userinfo>@ : the '@' comes before the first '/', '?' or '#' (the authority ends there), so
# `s3://bucket/key@v2` is a key holding '@', not credentials. A password may hold a '/' all the same (AWS secret
# keys often do, pasted unescaped): `user:pa/ss@`, a ':' in the authority followed by anything but a port.
USERINFO_PART = r"(?:[^/?#@\s]*@|[^/?#@\s:]*:(?!\d*(?:[/?#]|$))[^@\s]*?@)"
USERINFO = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://" + USERINFO_PART)
USERINFO_AFTER_SCHEME = re.compile(r"(?<=://)" + USERINFO_PART)  # what redaction removes


def has_credentials(text: str) -> bool:
    """True when text holds a URL with userinfo anywhere in it."""
    return USERINFO.search(text) is not None


def where_credentials_go(field: str, text: str) -> str:
    """Where the credentials of a URL in `field` belong instead, in words."""
    if field.split(".")[0] == "tracking" or field.startswith("MLFLOW_"):
        return "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN)"
    if re.search(r"\bs3a?://", text) or field.startswith(("storage", "AWS_", "CASCADE_STORE")):
        return (
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or an AWS profile "
            "(AWS_PROFILE, storage.profile; keys in ~/.aws/credentials)"
        )
    return "an environment variable, named by the OpenAI teacher's api_key_env for endpoints"


def credential_error(value: Any, where: str = "") -> str | None:
    """The first string in value (nested dicts and lists walked) that holds URL credentials, as a one-line
    message naming its field path (list items by their `name` or `kind`, else their index); None if none."""
    if isinstance(value, str):
        if not has_credentials(value):
            return None
        field = where or "(top level)"
        return (
            f"{field}: a URL holds credentials (user:password@host); remove them and put them in "
            f"{where_credentials_go(field, value)}"
        )
    if isinstance(value, dict):
        items = ((str(k), v) for k, v in value.items())
    elif isinstance(value, list | tuple):
        items = (
            (str(v.get("name", v.get("kind", i))) if isinstance(v, dict) else str(i), v) for i, v in enumerate(value)
        )
    else:
        return None
    for key, item in items:
        if found := credential_error(item, f"{where}.{key}" if where else key):
            return found
    return None
