# lane-router: the class-aware routing proxy, as a small non-root image, its request path compiled.
#   docker build -t lane-router:0.1.0 .
#   docker run -p 8080:8080 -v "$PWD/deploy:/etc/lane-router:ro" \
#     -e LANE_ROUTER_CONFIG=/etc/lane-router/example-profile.yaml lane-router:0.1.0

# The wheel, with the request path compiled by mypyc (docs/compiled.md). The compiler type-checks
# against the dependencies (with the tracing extra and the YAML stubs, as in development), so they
# are installed first and the wheel is built beside them.
FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /build
COPY pyproject.toml README.md setup.py ./
# The proxy only: .dockerignore keeps the lab (router/lab/) and the renderers (router/deploy/) out.
COPY router ./router
# The project itself, with its extra, is installed by its own ranges (pyproject.toml).
# hadolint ignore=DL3013
RUN pip install --no-cache-dir ".[tracing]" "types-PyYAML==6.0.12.20261122" "mypy==2.4.1" \
       "setuptools==80.9.0" "wheel==0.45.1" \
    && LANE_ROUTER_COMPILE=1 pip wheel --no-cache-dir --no-deps --no-build-isolation -w /wheels .

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

COPY --from=build /wheels /wheels
# The build is checked where it runs: a wheel without its compiled modules would serve slower.
RUN pip install --no-cache-dir /wheels/*.whl \
    && rm -rf /wheels \
    && python -c "import router, sys; print(router.BUILD.describe()); sys.exit(router.BUILD.mode != 'compiled')"

WORKDIR /
USER 10001:10001
EXPOSE 8080

# Liveness only: /ready (every lane has a healthy backend) is for the load balancer to judge.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('LANE_ROUTER_PORT', '8080'), timeout=2)"]

ENTRYPOINT ["lane-router", "serve"]
