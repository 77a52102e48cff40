"""Which hosts `chaosproxy mitm` decrypts and faults (`--hosts` globs, as mitmproxy's allow and ignore
lists), and the CA directory whose certificate the agent trusts."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from mitmproxy import certs

from chaosproxy.errors import ConfigError

DEFAULT_CONFDIR = Path("~/.mitmproxy")
CA_CERT = "mitmproxy-ca-cert.pem"  # what the agent trusts (SSL_CERT_FILE, REQUESTS_CA_BUNDLE, NODE_EXTRA_CA_CERTS)
_HOST_GLOB = re.compile(r"[A-Za-z0-9._*?:-]+")
_IPV4 = r"\d{1,3}(?:\.\d{1,3}){3}"
_IPV6 = r"[0-9A-Fa-f]*:[0-9A-Fa-f:.]*"  # at least one colon beside the port's: never a host name


class HostPatterns:
    """The `--hosts` globs (api.example.com, *.corp): hosts whose traffic is decrypted and faulted.

    Without globs every host is. Globs name hosts, not ports: every port of a listed host is in.
    """

    def __init__(self, globs: Sequence[str] = ()) -> None:
        self.globs = tuple(globs)
        self._regexes = [_glob_regex(_checked(glob)) for glob in self.globs]
        union = "|".join(f"(?:{regex})" for regex in self._regexes)
        self._fullmatch = re.compile(union, re.IGNORECASE).fullmatch if union else None

    @classmethod
    def parse(cls, value: str | None) -> HostPatterns:
        """From the flag's comma-separated value; ValueError quoting the offending glob."""
        if value is None:
            return cls()
        globs = [glob.strip() for glob in value.split(",")]
        if not any(globs):
            raise ValueError("--hosts is empty: give host globs such as api.example.com,*.corp")
        return cls(globs)

    def __contains__(self, host: str) -> bool:
        return self._fullmatch is None or self._fullmatch(host) is not None

    @property
    def allow_hosts(self) -> list[str]:
        """mitmproxy's `allow_hosts`: regexes on "host:port" (the CONNECT target, SNI, Host header or peer IP).

        A connection is decrypted when any of those names matches one, so a listed IP would also
        let in every name that resolves to it (--hosts 127.0.0.1 let localhost in): see ignore_hosts.
        """
        return [rf"^(?:{regex}):\d+$" for regex in self._regexes]

    @property
    def ignore_hosts(self) -> list[str]:
        """mitmproxy's `ignore_hosts`: a connection is tunnelled when a name the agent asked for (the
        CONNECT target, SNI, Host header) is not listed. IP addresses are exempt, since the peer IP
        mitmproxy also checks is where a listed name resolved to, not a name the agent chose."""
        if not self._regexes:
            return []
        listed = "|".join(f"(?:{regex})" for regex in self._regexes)
        return [rf"^(?!(?:{listed}):\d+$)(?!{_IPV4}:\d+$)(?!\[?{_IPV6}\]?:\d+$).+$"]

    def __str__(self) -> str:
        return ", ".join(self.globs) if self.globs else "every host"


def _checked(glob: str) -> str:
    host = glob.removeprefix("[").removesuffix("]")  # [::1]
    if not host:
        raise ValueError("--hosts has an empty entry (a stray comma?)")
    if "/" in host:
        raise ValueError(f"--hosts takes host names, not URLs: {glob!r} (e.g. api.example.com)")
    if host.count(":") == 1:
        raise ValueError(f"--hosts takes host names without a port: {glob!r} (every port of a listed host "
                         "is intercepted)")
    if not _HOST_GLOB.fullmatch(host):
        raise ValueError(f"invalid host glob {glob!r} in --hosts: use letters, digits, '.', '-', "
                         "and the wildcards '*' and '?'")
    return host


def _glob_regex(glob: str) -> str:
    return "".join(".*" if char == "*" else "." if char == "?" else re.escape(char) for char in glob)


class ConfdirError(ConfigError):
    """The CA directory cannot be used as given."""


def ca_directory(confdir: Path | None) -> Path:
    """The CA directory, with mitmproxy's CA in it (made on first use in the default ~/.mitmproxy).

    A directory given explicitly must exist (a typo should not silently mint a new CA the agent does
    not trust). Raises ConfdirError for a bad path, OSError when the CA cannot be written or read.
    """
    path = (confdir or DEFAULT_CONFDIR).expanduser()
    if confdir is not None and not path.exists():
        raise ConfdirError(f"the CA directory {path} does not exist (create it, or leave --confdir out "
                           f"to use {DEFAULT_CONFDIR})")
    if path.exists() and not path.is_dir():
        raise ConfdirError(f"the CA directory {path} is not a directory")
    try:
        certs.CertStore.from_store(path, "mitmproxy", 2048)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot keep mitmproxy's CA in {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:  # a damaged PEM
        raise ConfdirError(f"the CA in {path} is unreadable: {exc}") from exc
    return path
