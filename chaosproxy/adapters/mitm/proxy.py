"""mitmproxy in regular (forward) mode on chaosproxy's event loop, with the engine's addon."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from mitmproxy.addons import block, core, disable_h2c, next_layer, proxyserver, tlsconfig
from mitmproxy.exceptions import OptionsError
from mitmproxy.master import Master
from mitmproxy.options import Options

from chaosproxy.adapters.http.heads import RULE_BODY_LIMIT
from chaosproxy.adapters.mitm.addon import ChaosAddon
from chaosproxy.adapters.mitm.hosts import HostPatterns
from chaosproxy.engine.core import Engine
from chaosproxy.telemetry.log import ops


class MitmProxy:
    """mitmproxy in regular (forward) mode on our event loop, with the engine as its addon.

    mitmproxy keeps its options and master in module globals (`mitmproxy.ctx`): one per process.
    """

    def __init__(self, engine: Engine, hosts: HostPatterns, *, confdir: Path,
                 upstream_ca: Path | None = None) -> None:
        self.engine = engine
        self.hosts = hosts
        self.confdir = confdir
        self.upstream_ca = upstream_ca
        self.addon = ChaosAddon(engine, hosts)
        self._master: Master | None = None
        self._server: proxyserver.Proxyserver | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port. OSError when it cannot listen, ValueError for a bad option."""
        _forward_mitmproxy_log()
        master = self._master = Master(Options())
        server = self._server = self.addon.proxyserver = proxyserver.Proxyserver()
        # Only what forward-mode interception needs: no console, no flow store, no scripts, no replay.
        master.addons.add(core.Core(), block.Block(), disable_h2c.DisableH2C(), server, next_layer.NextLayer(),
                          tlsconfig.TlsConfig(), self.addon)
        try:
            master.options.update(
                mode=["regular"], listen_host=host, listen_port=port, confdir=str(self.confdir),
                allow_hosts=self.hosts.allow_hosts, ignore_hosts=self.hosts.ignore_hosts,
                # HTTP/1.1 to both sides: a reset or a truncation then hits one exchange, as under `run`
                http2=False,
                # a body of unknown length is buffered for rules up to this size, then streams on undecided
                stream_large_bodies=str(RULE_BODY_LIMIT),
                ssl_verify_upstream_trusted_ca=str(self.upstream_ca) if self.upstream_ca else None,
            )
        except OptionsError as exc:
            raise ValueError(str(exc)) from None
        mitm_log = logging.getLogger("mitmproxy")
        level, mitm_log.level = mitm_log.level, logging.CRITICAL  # its hint names mitmproxy's own flags
        try:
            started = await server.setup_servers()
        finally:
            mitm_log.setLevel(level)
        if not started:
            failed = next((s.last_exception for s in server.servers if s.last_exception), None)
            if isinstance(failed, OSError) and failed.errno:
                raise OSError(failed.errno, os.strerror(failed.errno))
            raise OSError(f"cannot listen on {host}:{port}: {failed}")
        await master.running()
        return server.listen_addrs()[0][1]

    async def stop(self) -> None:
        self.addon.release_all()
        if self._server is not None:
            if any(instance.is_running for instance in self._server.servers):
                await self._server.servers.update([])
            for handler in list(self._server.connections.values()):
                io = handler.transports.get(handler.client)
                if io is not None and io.writer is not None:
                    with contextlib.suppress(OSError):
                        io.writer.close()
        if self._master is not None:
            await self._master.done()


def _forward_mitmproxy_log() -> None:
    """mitmproxy's own warnings (a client that does not trust the CA, an upstream TLS failure) go to
    the operational log; its per-connection chatter only with --verbose."""
    logger = logging.getLogger("mitmproxy")
    if ops.handlers:
        logger.handlers[:] = ops.handlers
        logger.propagate = False
    logger.setLevel(logging.DEBUG if ops.level == logging.DEBUG else logging.WARNING)
