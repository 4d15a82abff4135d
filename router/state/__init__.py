"""What a running router holds: the runtime built from a profile (the composition root), the live state
it swaps on reload, the shared state of several replicas in Redis and the stores kept there,
including slots/. It may import lanes/, fleet/, keys/, request/, observe/, proxy/'s watchlist and
the layers below them."""
