# chaosproxy as a container: a sidecar beside an agent, or a service in front of its tool servers.
#
#   docker build -t chaosproxy .
#   docker run --rm -p 8800:8800 -e CHAOSPROXY_UPSTREAM=http://tools:9000 chaosproxy
#
# Configuration is by flags (`docker run IMAGE run --upstream URL ...`) or by environment: every option of
# `chaosproxy run` reads CHAOSPROXY_<OPTION>, a flag given wins.
#   CHAOSPROXY_UPSTREAM       the real tool server's base URL
#   CHAOSPROXY_ROUTES         PREFIX=URL,... several upstreams behind one proxy
#   CHAOSPROXY_LISTEN         where the agent connects (in the image 0.0.0.0:8800)
#   CHAOSPROXY_SCENARIO       scenario YAML (default: no faults), e.g. mounted at /etc/chaosproxy/scenario.yaml
#   CHAOSPROXY_LOG            perturbation log, JSON lines (default: stderr); /var/log/chaosproxy is writable
#   CHAOSPROXY_SEED           root seed
#   CHAOSPROXY_CONTROL        control API HOST:PORT (in the image 127.0.0.1:8801: the HEALTHCHECK reaches it,
#                             nothing outside the container does); 0.0.0.0:8801 needs a token as well
#   CHAOSPROXY_CONTROL_TOKEN  bearer token for the control API (GET /healthz needs none)
# `docker stop` sends SIGTERM to chaosproxy itself (PID 1): it stops cleanly and flushes its log.
# SIGHUP (`docker kill -s HUP`) reloads the scenario file.
#
# Nothing machine-specific is baked in. Where pip must trust a local CA, mount the bundle for the build:
#   podman build -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro .

FROM debian:trixie-slim AS runtime
# Debian's python3 (3.13); versions come from the release, so they are not pinned here.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/*

FROM runtime AS build
# python3-venv brings pip's wheel, which needs ca-certificates, whose postinst would replace
# /etc/ssl/certs/ca-certificates.crt: where a builder has mounted its own bundle there (see the top), that
# fails. So the Mozilla bundle is made in /opt/certs and copied into the final image; pip reads
# /etc/ssl/certs/ca-certificates.crt, which is the builder's bundle if mounted, else a link to that one.
# gcc and the Python headers: mypyc compiles the HTTP data plane (setup.py); the final image has neither.
# hadolint ignore=DL3008
RUN dpkg-divert --local --rename --add /usr/sbin/update-ca-certificates \
    && ln -s /bin/true /usr/sbin/update-ca-certificates \
    && apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates python3-venv gcc libc6-dev python3-dev \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir /opt/certs \
    && update-ca-certificates.distrib --etccertsdir /opt/certs \
    && { [ -s /etc/ssl/certs/ca-certificates.crt ] \
         || ln -sf /opt/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt; } \
    && python3 -m venv /opt/chaosproxy
# The dependencies get a layer of their own, so that a code change rebuilds only the package's layer.
COPY pyproject.toml /src/
RUN python3 -c "import tomllib; print(*tomllib.load(open('/src/pyproject.toml', 'rb'))['project']['dependencies'], sep=chr(10))" \
        > /src/requirements.txt \
    && /opt/chaosproxy/bin/pip install --no-cache-dir --disable-pip-version-check -r /src/requirements.txt
COPY README.md setup.py /src/
COPY chaosproxy /src/chaosproxy
RUN /opt/chaosproxy/bin/pip install --no-cache-dir --disable-pip-version-check /src \
    && /opt/chaosproxy/bin/pip uninstall -y --disable-pip-version-check pip \
    && /opt/chaosproxy/bin/chaosproxy --version

FROM runtime
RUN groupadd --system --gid 10001 chaosproxy \
    && useradd --system --uid 10001 --gid chaosproxy --home-dir /var/lib/chaosproxy --create-home \
       --shell /usr/sbin/nologin chaosproxy \
    && install -d -o chaosproxy -g chaosproxy -m 0755 /var/log/chaosproxy /etc/chaosproxy
COPY --from=build /opt/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /opt/chaosproxy /opt/chaosproxy

ENV PATH=/opt/chaosproxy/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    CHAOSPROXY_LISTEN=0.0.0.0:8800 \
    CHAOSPROXY_CONTROL=127.0.0.1:8801

USER 10001:10001
WORKDIR /var/lib/chaosproxy
EXPOSE 8800 8801

# GET /healthz on the control port (taken from CHAOSPROXY_CONTROL, 8801 by default); no curl in the image.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["python3", "-c", "import os, sys, urllib.request; port = (os.environ.get('CHAOSPROXY_CONTROL') or ':8801').rpartition(':')[2]; sys.exit(0 if urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=2).status == 200 else 1)"]

# Exec form: chaosproxy is PID 1 and gets SIGTERM itself (it stops cleanly and flushes its log).
STOPSIGNAL SIGTERM
ENTRYPOINT ["chaosproxy"]
CMD ["run"]
