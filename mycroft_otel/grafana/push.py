"""Push :class:`~mycroft_otel.grafana.payloads.Payloads` to a Grafana through ``grafana-client``.

Idempotent: each object is looked up by uid and updated when it exists, created otherwise
(datasources, the folder, dashboards with ``overwrite``, alert rules, then each rule group's
interval and rule list). Errors are translated into one line a user can act on
(:class:`GrafanaError`): unreachable, credentials refused (401), permission missing (403),
payload rejected (400, with Grafana's message), server errors. No message carries a
credential: the URL is shown without ``user:password@`` and the token, password and
URL credentials are scrubbed from any text quoted from the client library.
"""

from __future__ import annotations

import re
from typing import Callable

from mycroft_otel.grafana.payloads import Payloads
from mycroft_otel.redact import safe_url, scrub


class GrafanaError(RuntimeError):
    """Provisioning cannot go on (unreachable, unauthorised, ...)."""

    def __init__(self, message: str, fatal: bool = True):
        super().__init__(message)
        self.fatal = fatal


def _client_module():
    try:
        import grafana_client
        from grafana_client import client as gc
    except ImportError:
        raise GrafanaError("the grafana-client package is not installed: pip install 'mycroft-otel[grafana]' "
                           "(or pip install grafana-client)") from None
    return grafana_client, gc


def _url_secrets(url: str) -> list[str]:
    """The user and password in ``url`` (and their %-decoded forms)."""
    from urllib.parse import unquote, urlsplit
    try:
        p = urlsplit(url)
    except ValueError:
        return [url]
    out = [x for x in (p.username, p.password) if x]
    return out + [unquote(x) for x in out]


def explain(exc: BaseException, url: str, what: str, secrets: tuple = ()) -> GrafanaError:
    """One actionable line for an exception raised by grafana-client / niquests, free of credentials."""
    err = _explain(exc, safe_url(url), what)
    return GrafanaError(scrub(str(err), (*secrets, *_url_secrets(url))), fatal=err.fatal)


def _explain(exc: BaseException, url: str, what: str) -> GrafanaError:
    _, gc = _client_module()
    if isinstance(exc, gc.GrafanaUnauthorizedError):
        return GrafanaError(f"Grafana at {url} refused the credentials (401 Unauthorized) while {what}: "
                            "give a service account token (GRAFANA_TOKEN or --token-file) or --user with "
                            "GRAFANA_PASSWORD / --password-file")
    if isinstance(exc, gc.GrafanaClientError) and exc.status_code == 403:
        return GrafanaError(f"Grafana at {url} denied {what} (403 Forbidden): the account needs the Admin role "
                            "(datasources, alert rules) or Editor (dashboards)")
    if isinstance(exc, gc.GrafanaBadInputError):
        return GrafanaError(f"Grafana at {url} rejected {what} (400 Bad Request): {_msg(exc)}", fatal=False)
    if isinstance(exc, gc.GrafanaClientError):
        return GrafanaError(f"Grafana at {url} answered {exc.status_code} while {what}: {_msg(exc)}", fatal=False)
    if isinstance(exc, gc.GrafanaServerError):
        return GrafanaError(f"Grafana at {url} failed while {what} ({exc.status_code} server error): {_msg(exc)}",
                            fatal=False)
    if isinstance(exc, gc.GrafanaTimeoutError) or type(exc).__name__ in ("Timeout", "ReadTimeout",
                                                                        "ConnectTimeout"):
        return GrafanaError(f"Grafana at {url} did not answer in time while {what} (raise --timeout?)")
    if isinstance(exc, (OSError, ConnectionError)) or "Connection" in type(exc).__name__ \
            or type(exc).__module__.startswith(("niquests", "urllib3")):
        return GrafanaError(f"cannot reach Grafana at {url} ({type(exc).__name__}: {_short(exc)}): "
                            "check --url and that Grafana is running")
    return GrafanaError(f"unexpected error from Grafana at {url} while {what}: {type(exc).__name__}: {_short(exc)}")


def _short(exc: BaseException) -> str:
    text = str(exc).strip()
    m = re.search(r"\[Errno -?\d+\] [^'\")\]]+|Failed to resolve '[^']+'|Name or service not known", text)
    if m:
        return m.group(0).strip()
    s = text.splitlines()
    return (s[0] if s else "")[:300]


def _msg(exc) -> str:
    r = getattr(exc, "response", None)
    if isinstance(r, dict):
        return str(r.get("message") or r.get("error") or r)[:300]
    return _short(exc)


def connect(url: str, token: str | None = None, user: str | None = None, password: str | None = None,
            timeout: float = 10.0):
    """A GrafanaApi that has answered an authenticated request (so 401/unreachable surface here)."""
    grafana_client, _ = _client_module()
    credential = token if token else ((user, password or "") if user else None)
    secrets = (token, password, *_url_secrets(url))
    shown = safe_url(url)
    try:
        api = grafana_client.GrafanaApi.from_url(url, credential=credential, timeout=timeout)
    except (TypeError, ValueError) as exc:
        raise GrafanaError(scrub(f"bad --url {shown!r}: {exc}", secrets)) from None
    if not api.client.url_host:
        raise GrafanaError(f"bad --url {shown!r}: expected http(s)://HOST[:PORT][/PATH]")
    for what, call in (("checking its health", api.health.check),
                       ("reading the current organisation", api.organization.get_current_organization)):
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - translated
            raise explain(exc, url, what, secrets) from None
    return api


def _status(exc) -> int | None:
    return getattr(exc, "status_code", None)


def push(api, p: Payloads, url: str, log: Callable[[str], None] = print) -> list[str]:
    """Upsert everything; returns the non-fatal failures (fatal ones raise GrafanaError)."""
    failures: list[str] = []

    def fail(what, exc) -> None:
        err = explain(exc, url, what)
        if err.fatal:
            raise err from None
        failures.append(str(err))
        log(f"  FAILED {what}: {err}")

    def attempt(what, fn):
        try:
            return fn()
        except GrafanaError:
            raise
        except Exception as exc:  # noqa: BLE001 - translated
            fail(what, exc)
            return None

    def exists(fn) -> bool:
        try:
            fn()
            return True
        except Exception as exc:  # noqa: BLE001
            if _status(exc) == 404:
                return False
            raise

    for ds in p.datasources:
        uid = ds["uid"]
        what = f"datasource {uid}"
        try:
            found = exists(lambda: api.datasource.get_datasource_by_uid(uid))
        except Exception as exc:  # noqa: BLE001
            raise explain(exc, url, f"looking up {what}") from None
        if found:
            try:
                api.datasource.update_datasource_by_uid(uid, ds)
                log(f"  updated {what} ({ds['type']}, {ds['url']})")
            except Exception as exc:  # noqa: BLE001
                if _status(exc) == 403 and "read-only" in _msg(exc).lower():
                    log(f"  kept {what}: provisioned read-only from a file on the Grafana host")
                else:
                    fail(f"updating {what}", exc)
        elif attempt(f"creating {what}", lambda: api.datasource.create_datasource(ds)) is not None:
            log(f"  created {what} ({ds['type']}, {ds['url']})")

    f = p.folder
    if p.dashboards or p.rule_groups:
        try:
            found = exists(lambda: api.folder.get_folder(f["uid"]))
        except Exception as exc:  # noqa: BLE001
            raise explain(exc, url, f"looking up folder {f['uid']}") from None
        if not found:
            if attempt(f"creating folder {f['uid']}", lambda: api.folder.create_folder(f["title"], uid=f["uid"])):
                log(f"  created folder {f['title']} ({f['uid']})")
        else:
            log(f"  folder {f['title']} ({f['uid']}) exists")

    for d in p.dashboards:
        uid = d["dashboard"]["uid"]
        if attempt(f"saving dashboard {uid}", lambda: api.dashboard.update_dashboard(d)) is not None:
            log(f"  saved dashboard {uid} ({d['dashboard'].get('title')})")

    for g in p.rule_groups:
        for r in g["rules"]:
            uid = r["uid"]
            try:
                found = exists(lambda: api.alertingprovisioning.get_alertrule(uid))
            except Exception as exc:  # noqa: BLE001
                raise explain(exc, url, f"looking up alert rule {uid}") from None
            if found:
                ok = attempt(f"updating alert rule {uid}", lambda: api.alertingprovisioning.update_alertrule(
                    uid, r, disable_provenance=True))
                verb = "updated"
            else:
                ok = attempt(f"creating alert rule {uid}", lambda: api.alertingprovisioning.create_alertrule(
                    r, disable_provenance=True))
                verb = "created"
            if ok is not None:
                log(f"  {verb} alert rule {uid} ({r['title']})")
        if attempt(f"setting rule group {g['title']}", lambda: api.alertingprovisioning.update_rule_group(
                g["folderUid"], g["title"], g, disable_provenance=True)) is not None:
            log(f"  rule group {g['title']}: every {g['interval']} s, {len(g['rules'])} rule(s)")
    return failures
