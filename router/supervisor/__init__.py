"""The worker processes of `serve --workers N`: starting and watching them, the link and the channel
between supervisor and worker, and their merged metrics. It may import the request path (app/,
state/, httpserver/, observe/, tls/) and the flat base modules; only the server and the command line
import it."""
