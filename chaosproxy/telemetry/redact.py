"""What the proxy shows of what it was given (spans, log lines, reports, the start-up line, errors): no secret
leaves in a URL, and a value from an agent or upstream is bounded (`truncated`).

A configured upstream or collector may carry credentials in its userinfo, and an agent's request may be
a signed URL. The OpenTelemetry URL conventions say what to do with both, and the proxy does it wherever
it shows a URL: credentials MUST NOT be recorded (shown as `REDACTED:REDACTED`), and the values of the
query keys signed URLs carry their secrets in SHOULD be redacted (`REDACTED`), the keys kept and matched
case-sensitively.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)[^/?#]*@")
# the conventions' list (AWS, CloudFront, Azure SAS, Google Cloud Storage signed URLs)
TRUNCATED = "…"  # the last character of a value that was cut
SENSITIVE_QUERY_KEYS = frozenset({"AWSAccessKeyId", "Signature", "sig", "X-Goog-Signature", "X-Amz-Signature",
                                  "X-Amz-Credential", "X-Amz-Security-Token"})


def redacted_url(url: str) -> str:
    """`url` with its userinfo as `REDACTED:REDACTED` and the values of SENSITIVE_QUERY_KEYS (also when
    percent-encoded) as `REDACTED`; all else as it is."""
    url = USERINFO.sub(r"\1REDACTED:REDACTED@", url, count=1) if "@" in url else url
    query_at = url.find("?")
    if query_at < 0:
        return url
    end = url.find("#", query_at)
    end = len(url) if end < 0 else end
    pairs = url[query_at + 1:end].split("&")
    redacted = [f"{key}=REDACTED" if (key := pair.partition("=")[0]) in SENSITIVE_QUERY_KEYS
                or "%" in key and unquote(key) in SENSITIVE_QUERY_KEYS else pair for pair in pairs]
    return url if redacted == pairs else f"{url[:query_at + 1]}{'&'.join(redacted)}{url[end:]}"


def was_redacted(url: str) -> bool:
    """Whether `url` is one `redacted_url` took a secret out of (the real one is not to be had from it)."""
    return "://REDACTED:REDACTED@" in url or "=REDACTED" in url


def truncated(text: str, limit: int) -> str:
    """`text` when at most `limit` characters, else cut to that many, its last one TRUNCATED."""
    return text if len(text) <= limit else text[:max(0, limit - 1)] + TRUNCATED
