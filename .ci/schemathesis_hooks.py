"""Schemathesis hooks for `.ci/schemathesis`.

Every rule the server enforces is in the OpenAPI document, except three that
a static JSON Schema cannot state. For cases schemathesis generated as valid
(positive), these hooks draw the values inside the rule, so a refusal of valid
data still fails the run; negative cases are left exactly as generated:

- `fulfillment.deadline` must lie in the future, at most 90 days ahead: it
  depends on the clock.
- `created_gte` must not be after `created_lte` (GET /v1/payments): a rule
  between two parameters.
- An `Idempotency-Key` names one request: the same key with other parameters
  is refused (400 `idempotency_key_reused`, tested in the Rust suite).
  Hypothesis repeats short keys across unrelated cases, so a well-formed key
  gets a per-case suffix (it stays well formed; a malformed one is untouched).
"""

import itertools
import re
import time

import schemathesis

_MAX_FULFILLMENT_WINDOW_MS = 90 * 24 * 3600 * 1000
_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")
_counter = itertools.count()


def _positive(case) -> bool:
    meta = getattr(case, "meta", None)
    return meta is not None and meta.generation.mode.is_positive


def _unique_keys(case) -> None:
    headers = case.headers or {}
    for name in list(headers):
        value = headers[name]
        if name.lower() == "idempotency-key" and isinstance(value, str) and _KEY.match(value):
            suffix = f"-{next(_counter):x}"
            headers[name] = value[: 255 - len(suffix)] + suffix


def _integer(value):
    """The integer a generated value stands for (`5`, `5.0`, `"5"`), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None


def _deadline_in_window(case) -> None:
    body = case.body
    fulfillment = body.get("fulfillment") if isinstance(body, dict) else None
    deadline = _integer(fulfillment.get("deadline")) if isinstance(fulfillment, dict) else None
    if deadline is not None:
        now_ms = int(time.time() * 1000)
        offset = 60_000 + deadline % (_MAX_FULFILLMENT_WINDOW_MS - 120_000)
        fulfillment["deadline"] = now_ms + offset


def _ordered_created_range(case) -> None:
    query = case.query
    if not isinstance(query, dict):
        return
    gte, lte = _integer(query.get("created_gte")), _integer(query.get("created_lte"))
    if gte is not None and lte is not None and gte > lte:
        query["created_gte"], query["created_lte"] = query["created_lte"], query["created_gte"]


@schemathesis.hook
def before_call(context, case, kwargs):
    _unique_keys(case)
    if _positive(case):
        _deadline_in_window(case)
        _ordered_created_range(case)
