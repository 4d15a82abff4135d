"""The servers behind the router: a `Backend` and its `Health`, a `Pool` and its members, how discovery
finds them, how probes judge them, and the fleet that adds and drains them. It may import proxy/'s
upstream connections, balance/, tls/, config/, observe/ and the flat base modules; the pool's gate
is handed to it by the runtime."""
