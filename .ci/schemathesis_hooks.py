"""Schemathesis hooks for `.ci/schemathesis`.

Every rule the server enforces is in the OpenAPI document, except four that
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
- A routing configuration (PUT /admin/merchants/{id}/routing) is judged as a
  whole: rule ids unique, each rule's accounts distinct and their weights not
  all 0, `min_amount_minor` not above `max_amount_minor`, one override per
  adapter and code (uniqueness by a key, and relations between fields, which
  JSON Schema cannot say; tested in the Rust suite).
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


def _distinct(value: str, seen: set, max_len: int) -> str:
    """`value`, or a variant of it not in `seen` (still visible ASCII, at most `max_len`)."""
    candidate, n = value, 0
    while candidate in seen:
        n += 1
        suffix = f"~{n}"
        candidate = value[: max_len - len(suffix)] + suffix
    seen.add(candidate)
    return candidate


def _routing_as_a_whole(case) -> None:
    if case.method.upper() != "PUT" or not case.path.endswith("/routing"):
        return
    body = case.body
    if not isinstance(body, dict):
        return
    ids = set()
    for rule in body.get("rules") or []:
        if not isinstance(rule, dict):
            continue
        if isinstance(rule.get("id"), str):
            rule["id"] = _distinct(rule["id"], ids, 64)
        accounts = [a for a in rule.get("accounts") or [] if isinstance(a, dict)]
        names = set()
        for account in accounts:
            if isinstance(account.get("connector_account"), str):
                account["connector_account"] = _distinct(account["connector_account"], names, 64)
        if accounts and all(a.get("weight") == 0 for a in accounts):
            accounts[0]["weight"] = 1
        when = rule.get("when")
        if isinstance(when, dict):
            lo, hi = _integer(when.get("min_amount_minor")), _integer(when.get("max_amount_minor"))
            if lo is not None and hi is not None and lo > hi:
                when["min_amount_minor"], when["max_amount_minor"] = hi, lo
    pairs = set()
    for override in body.get("failure_overrides") or []:
        if not isinstance(override, dict) or not isinstance(override.get("code"), str):
            continue
        seen = {code for adapter, code in pairs if adapter == override.get("adapter")}
        override["code"] = _distinct(override["code"], seen, 128)
        pairs.add((override.get("adapter"), override["code"]))


@schemathesis.hook
def before_call(context, case, kwargs):
    _unique_keys(case)
    if _positive(case):
        _deadline_in_window(case)
        _ordered_created_range(case)
        _routing_as_a_whole(case)
