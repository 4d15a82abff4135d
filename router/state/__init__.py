"""What a running router holds: the runtime built from a profile (runtime.py, the composition root),
the live holder it is swapped in on reload (live.py), the shared state of several replicas in Redis
(shared.py) and the stores kept there, slots/ among them. It may import every folder of the request
path below app/ (lanes/, fleet/, keys/, request/, observe/, proxy/'s watchlist, balance/, tls/,
config/) and the flat base modules."""
