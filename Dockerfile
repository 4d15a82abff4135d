# lane-router: the class-aware routing proxy, as a small non-root image.
#   docker build -t lane-router:0.1.0 .
#   docker run -p 8080:8080 -v "$PWD/deploy:/etc/lane-router:ro" \
#     -e LANE_ROUTER_CONFIG=/etc/lane-router/example-profile.yaml lane-router:0.1.0
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    LANE_ROUTER_HOST=0.0.0.0 \
    LANE_ROUTER_PORT=8080

RUN groupadd --system --gid 10001 lane-router \
    && useradd --system --uid 10001 --gid lane-router --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin lane-router

WORKDIR /build
COPY pyproject.toml README.md ./
# The proxy only: .dockerignore keeps the lab (router/lab/) and the renderers (router/deploy/) out.
COPY router ./router
RUN pip install --no-cache-dir . \
    && rm -rf /build

WORKDIR /
USER 10001:10001
EXPOSE 8080

# Liveness only: /ready (every lane has a healthy backend) is for the load balancer to judge.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('LANE_ROUTER_PORT', '8080'), timeout=2)"]

ENTRYPOINT ["lane-router", "serve"]
