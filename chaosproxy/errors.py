"""What chaosproxy raises on purpose, under one base, so that a caller (the command line, a test suite
embedding the proxy) can tell the proxy's refusals from bugs.

- ConfigError: input the user gave cannot be used (a scenario, a flag, a file, a cassette, a drill
  folder); the message says where (FILE:LINE where there is one) and why. The command line prints it
  and exits 2, before anything starts.
- The data plane's typed failures of an upstream (chaosproxy.adapters.errors), of a server command
  (SpawnError), of a model API's body (FormatError) are ChaosproxyErrors too.

What is not raised but caught: the proxy fails open (a broken fault or relay passes the traffic through
and logs an error). Each deliberate catch-all says so with a comment that starts `# fail open:` and
says what goes on instead, so that they can be found (`grep -rn "fail open:" chaosproxy`).
"""


class ChaosproxyError(Exception):
    """An error chaosproxy raises on purpose."""


class ConfigError(ChaosproxyError, ValueError):
    """Input that cannot be used as given; the message says where and why."""
