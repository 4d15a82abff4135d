"""The router's own HTTP/1.1 server for ASGI apps (http and lifespan scopes), on asyncio and
httptools' parser.

- config.py: `ServerConfig`, the limits and timeouts
- server.py: `HttpServer`, the listener, its connections and the graceful stop
- process.py: `serve`, the server as the process's main job, stopped by SIGINT/SIGTERM
- connection.py: one connection: requests in order (pipelining), deadlines, closing
- reader.py: the reading half of a connection: the parser, the head limits
- deadlines.py: the one lazily re-armed timer of a connection
- exchange.py: one request and its response, the app's `receive` and `send`
- framing.py: response heads and body framing
- scope.py: the request scope
- dispatch.py: calling the app and handling how the call ends
- lifespan.py: the lifespan scope
- wire.py: bytes the server writes on its own (status lines, date, error answers)
"""

from router.httpserver.config import HEAD_TIMEOUT_MAX_S, ServerConfig
from router.httpserver.lifespan import StartupFailed
from router.httpserver.process import serve
from router.httpserver.server import HttpServer

__all__ = ["HEAD_TIMEOUT_MAX_S", "HttpServer", "ServerConfig", "StartupFailed", "serve"]
