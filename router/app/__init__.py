"""The ASGI application: the app object the HTTP server calls, the routes of the API and the admin
endpoints. It may import every other folder of the proxy (it is the top of the request path, under
the command line and the supervisor), never the lab or the deployment renderers."""
