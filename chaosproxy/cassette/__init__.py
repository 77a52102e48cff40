"""Record, replay, perturb and compare: cassettes of the traffic between the proxy and its upstreams.

`format` is the cassette on disk (documented and versioned there); `redact` keeps secrets out of it;
`recorder` writes one from what the HTTP data plane and the stdio relay exchange with the upstream;
`vcr` reads and writes VCR.py cassettes, `reading` either kind; `match` says which recorded exchange a
live request is; `replay` serves a cassette as the upstream (HTTP on the data plane's wire, or stdio),
`embedded` from a background thread (the pytest plugin's fixture); `drift` compares a cassette with the
live upstream; `command` is the command line's part.
May import: adapters (the wire the replay server is built on), control (a run's runtime), engine,
protocols and telemetry; never drill, report or cli (the drill imports it: a drill may run offline).
"""
