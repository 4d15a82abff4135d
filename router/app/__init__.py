"""The ASGI application: the app object the HTTP server calls (app.py), the ASGI types and the body
writer the server hands a response to (asgi.py), the table of the API's routes (routes.py) and the
admin endpoints (admin.py). app.py is the top of the request path: it may import every folder of the
proxy but supervisor/ and the flat entry modules (cli, commands, server). asgi.py and routes.py are
read from below (the HTTP server, the proxy, the request readers) and import nothing of the router
but errors."""
