"""Lanes: the lane object (lane.py), how a request is classified into one, its settings as every
request reads them, the slow-client and prefix policies, admission, and the pool gate a lane's
requests wait at for a backend (poolgate.py; the order its waiters are served in, fairqueue.py;
the ticket a request holds there and what the gate reads of a lane, ticket.py). It may import
fleet/ (the backends it admits to), keys/, request/, observe/, balance/, the slots' arithmetic
(state/slots/budget.py), the HTTP server's wire helpers, config/ and the flat base modules; never
the proxy or the runtime."""
