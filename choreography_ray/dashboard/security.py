"""The dashboard's guard: the action token, the session cookie, CSRF and the response headers.

- The **token** is `CHOREOGRAPHY_DASHBOARD_TOKEN` when set, else random, made at start and
  printed once. Every key below is derived from it, so a new token ends every session.
- A **session** is the cookie `cr_session` = `nonce.signature`, HMAC-SHA256 of the nonce under
  the token's key, set by `/login` for the right token. An action is allowed with a valid
  session, or with the token itself in the action's form (`token` field), checked in constant
  time either way.
- **CSRF**: every page that shows a form has the cookie `cr_csrf` (a random nonce) and a hidden
  field `csrf` holding the HMAC of that nonce (a signed double-submit cookie). A POST whose field
  does not match its cookie is refused before it is read further; a site elsewhere can neither
  read the cookie nor compute the field. Both cookies are `HttpOnly` and `SameSite=Strict`, and
  a POST whose `Origin` names another host is refused too.
- **Headers** on every answer: a Content-Security-Policy that allows only the dashboard's own
  scripts, styles and forms and no framing (so a confirmation cannot be clickjacked), `nosniff`
  and `no-referrer` (a page's address never leaks to another site).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response

#: The environment variable a fixed token is read from.
TOKEN_ENV = "CHOREOGRAPHY_DASHBOARD_TOKEN"
SESSION_COOKIE = "cr_session"
CSRF_COOKIE = "cr_csrf"
#: How long a session lasts, in seconds.
SESSION_SECONDS = 12 * 3600
#: Bytes of randomness in a generated token and in each nonce.
TOKEN_BYTES = 24

SECURITY_HEADERS = {
    "content-security-policy": "default-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


def token_from_environment() -> tuple[str, bool]:
    """The action token, and whether it was generated here (and so must be printed)."""
    given = os.environ.get(TOKEN_ENV, "").strip()
    if given:
        return given, False
    return secrets.token_urlsafe(TOKEN_BYTES), True


class Refused(Exception):
    """A request the guard turns away: `status` and why."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class Guard:
    def __init__(self, token: str) -> None:
        self._token = token.encode()
        self._key = hashlib.sha256(b"choreography-ray dashboard\0" + self._token).digest()

    def _sign(self, purpose: str, nonce: str) -> str:
        message = f"{purpose}:{nonce}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def seal(self, purpose: str, text: str) -> str:
        """`text` with its signature, for a cookie the dashboard reads back (`unseal`)."""
        data = base64.urlsafe_b64encode(text.encode()).decode()
        return f"{data}.{self._sign(purpose, data)}"

    def unseal(self, purpose: str, sealed: str) -> str | None:
        """The text `seal` sealed for `purpose`, or None when it was not sealed here."""
        data, _, signature = sealed.partition(".")
        if not data or not hmac.compare_digest(signature, self._sign(purpose, data)):
            return None
        try:
            return base64.urlsafe_b64decode(data.encode()).decode()
        except (ValueError, UnicodeDecodeError):
            return None

    # the token and the session
    def is_token(self, candidate: str | None) -> bool:
        return candidate is not None and hmac.compare_digest(candidate.encode(), self._token)

    def logged_in(self, request: Request) -> bool:
        nonce, _, signature = request.cookies.get(SESSION_COOKIE, "").partition(".")
        return bool(nonce) and hmac.compare_digest(signature, self._sign("session", nonce))

    def log_in(self, response: Response) -> None:
        nonce = secrets.token_urlsafe(TOKEN_BYTES)
        value = f"{nonce}.{self._sign('session', nonce)}"
        response.set_cookie(SESSION_COOKIE, value, max_age=SESSION_SECONDS, httponly=True,
                            samesite="strict")  # fmt: skip

    @staticmethod
    def log_out(response: Response) -> None:
        response.delete_cookie(SESSION_COOKIE, httponly=True, samesite="strict")

    # CSRF
    def csrf_nonce(self, request: Request) -> str:
        """The request's CSRF nonce: its cookie's, or a new one (`remember_csrf` sets it)."""
        nonce = request.cookies.get(CSRF_COOKIE, "")
        if not nonce:
            nonce = getattr(request.state, "csrf_nonce", "") or secrets.token_urlsafe(TOKEN_BYTES)
            request.state.csrf_nonce = nonce
        return nonce

    def csrf_field(self, request: Request) -> str:
        """The value of a form's hidden `csrf` field."""
        return self._sign("csrf", self.csrf_nonce(request))

    @staticmethod
    def remember_csrf(request: Request, response: Response) -> None:
        """Sets the CSRF cookie when this request made a new nonce."""
        nonce = getattr(request.state, "csrf_nonce", "")
        if nonce and not request.cookies.get(CSRF_COOKIE):
            response.set_cookie(CSRF_COOKIE, nonce, httponly=True, samesite="strict")

    def check_form(self, request: Request, form: Mapping[str, object]) -> None:
        """Raises `Refused` for a POST from another origin or without a matching CSRF field."""
        origin = request.headers.get("origin")
        if origin and origin != "null" and urlsplit(origin).netloc != request.headers.get("host"):
            raise Refused(403, f"a form sent from {origin} is not accepted here")
        nonce = request.cookies.get(CSRF_COOKIE, "")
        field = form.get("csrf")
        if not nonce or not isinstance(field, str):
            raise Refused(403, "the form is missing its CSRF check: reload the page and retry")
        if not hmac.compare_digest(field, self._sign("csrf", nonce)):
            raise Refused(403, "the form's CSRF check does not match: reload the page and retry")

    def check_action(self, request: Request, form: Mapping[str, object]) -> None:
        """`check_form`, then the token: a session, or the token in the form."""
        self.check_form(request, form)
        token = form.get("token")
        if self.logged_in(request) or self.is_token(token if isinstance(token, str) else None):
            return
        raise Refused(403, "actions need the dashboard's token: log in, or give it in the form")
