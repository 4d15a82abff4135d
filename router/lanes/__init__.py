"""Lanes: how a request is classified into one, the lane's settings, the slow-client and prefix
policies, admission, and the pool gate a lane waits at for a backend. It may import fleet/ (the
backends it admits to), request/, observe/, balance/, config/ and the flat base modules."""
