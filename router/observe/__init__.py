"""What the router tells about itself: the metrics and the lean histograms of the request path, the
observer, the record of one request, the access log and tracing. It may import config/, the keys'
usage arithmetic (keys/ratelimit.py) and the flat base modules; never the proxy, the runtime, the
lanes or the fleet (pyproject's import contracts)."""
