"""The servers behind the router: a backend and its health (backend.py), a pool and its members
(pool.py), how discovery finds them, how probes and scrapes judge them, and the fleet that adds and
drains them (fleet.py). backend.py and pool.py may import proxy/'s upstream connections, the lanes'
pool gate, balance/, tls/, config/ and the flat base modules; the loops over a live runtime
(health.py, discovery.py, scrape.py) may import state/ as well."""
