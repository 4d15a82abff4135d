"""API keys and what is charged to them: the key ring a request authenticates against (auth.py), the
checks of key material a profile brings (hygiene.py) and the per-key rate limits (ratelimit.py). It
may import request/, config/ and the flat base modules (errors, settings); never the proxy, the
runtime, the lanes or the fleet (pyproject's import contracts)."""
