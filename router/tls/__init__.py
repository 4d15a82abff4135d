"""TLS on both sides of the router.

- contexts.py: the SSL contexts — the listener's (certificate, key, optional client CA) and the
  backends' (CA bundle, optional client certificate) — built from files, with one error type
- serving.py: `ServingTls`, the listener's TLS: loaded at start, re-read on SIGHUP, its failed
  handshakes counted and logged
- upstream.py: `UpstreamTls`, a pool's TLS towards its backends, and how a failed handshake
  with a backend is named to the client and in the metrics
"""
