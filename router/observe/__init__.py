"""What the router tells about itself: metrics, the lean histograms of the request path, the observer,
the record of one request, the access log and tracing. A leaf: it may import config/ and the flat
base modules only."""
