"""The nginx side of the peers benchmark: a configuration for a foreground nginx that keeps
everything (pid, logs, temp files) under one prefix directory, so it needs no root and leaves
the system's nginx alone.

One worker, pinned to the proxy core; upstream keep-alive, and `proxy_buffering off` so each
upstream read is relayed at once, as the other proxies do with SSE."""

from __future__ import annotations

from pathlib import Path

_TEMPLATE = """\
# written by router.lab.bench.peers: a benchmark reverse proxy, not the system service
daemon off;
master_process on;
worker_processes 1;
worker_cpu_affinity {affinity};
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;

events {{
    worker_connections 8192;
    use epoll;
    multi_accept on;
}}

http {{
    access_log off;
    client_body_temp_path {prefix}/tmp/body;
    proxy_temp_path {prefix}/tmp/proxy;
    fastcgi_temp_path {prefix}/tmp/fastcgi;
    uwsgi_temp_path {prefix}/tmp/uwsgi;
    scgi_temp_path {prefix}/tmp/scgi;
    tcp_nodelay on;
    keepalive_timeout 75s;
    keepalive_requests 1000000;

    upstream backend {{
{servers}
        keepalive 128;
        keepalive_requests 1000000;
        # below uvicorn's 5 s, so nginx, not the backend, closes an idle connection
        keepalive_timeout 4s;
    }}

    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 60s;
        }}
    }}
}}
"""
_TEMP_DIRS = ("tmp/body", "tmp/proxy", "tmp/fastcgi", "tmp/uwsgi", "tmp/scgi", "logs")


def affinity_mask(cpu: int) -> str:
    """nginx's `worker_cpu_affinity` bitmask for one CPU (rightmost bit is CPU 0)."""
    return "1" + "0" * cpu


def render(prefix: Path, port: int, upstreams: list[str], cpu: int) -> str:
    servers = "\n".join(f"        server {origin};" for origin in upstreams)
    return _TEMPLATE.format(prefix=prefix, port=port, servers=servers, affinity=affinity_mask(cpu))


def write_config(prefix: Path, port: int, upstreams: list[str], cpu: int) -> Path:
    """Write PREFIX/nginx.conf and the directories it names; return the file.
    (nginx opens PREFIX/logs/error.log before it reads `error_log`, hence `logs/`.)"""
    prefix = prefix.resolve()
    for sub in _TEMP_DIRS:
        (prefix / sub).mkdir(parents=True, exist_ok=True)
    conf = prefix / "nginx.conf"
    conf.write_text(render(prefix, port, upstreams, cpu))
    return conf


def command(nginx: str, conf: Path) -> list[str]:
    return [nginx, "-p", str(conf.parent), "-c", str(conf)]
