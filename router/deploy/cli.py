"""`lane-router render vllm|compose|k8s CONFIG`: a profile as something to run.

The renderers build data; this module turns it into text and writes it to stdout or `--out DIR`
(`vllm-serve.sh`, `compose.yaml` or `lane-router.yaml`). A profile the renderers cannot express
for its vLLM version exits 2 with the reason, like an invalid profile; so does one with a literal
key anyone can use (router/keys/hygiene.py), since what is rendered listens on the network.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from router.config.load import ConfigError, load_profile
from router.config.models import ProfileConfig
from router.config.render import RenderError
from router.deploy.k8s_options import (
    DEFAULT_WAITING,
    DEFAULTS,
    SCALE_SIGNALS,
    parse_autoscaler,
    parse_scraper,
)
from router.deploy.plan import DEVICES, Device
from router.deploy.render_compose import ComposeOptions, render_compose
from router.deploy.render_k8s import K8sOptions, render_k8s
from router.deploy.render_vllm import serve_plan, serve_script
from router.deploy.yamltext import dump_all
from router.keys.hygiene import key_issues, refusal

TARGETS = ("vllm", "compose", "k8s")
K8S_FLAGS = {
    "--namespace": "namespace",
    "--cluster-domain": "cluster_domain",
    "--autoscale": "autoscale",
    "--prometheus": "prometheus",
    "--prometheus-pods": "prometheus_pods",
    "--autoscale-on": "autoscale_on",
}
T = TypeVar("T")
OUTPUT_FILES = {"vllm": "vllm-serve.sh", "compose": "compose.yaml", "k8s": "lane-router.yaml"}


def configure(name: str, render: argparse.ArgumentParser) -> None:
    render.description = (
        "Render a profile for deployment: 'vllm' prints one vllm serve command per backend, "
        "'compose' a docker compose file, 'k8s' Kubernetes manifests. Exit 2 when the profile is invalid "
        "or asks for a flag its vLLM version lacks."
    )
    render.add_argument("target", choices=TARGETS)
    render.add_argument("config", type=Path, help="profile file")
    render.add_argument("--device", choices=DEVICES, default="gpu", help="vLLM build to run (default gpu)")
    files = ", ".join(OUTPUT_FILES.values())
    render.add_argument("--out", type=Path, help=f"write into this directory ({files})")
    render.add_argument(
        "--context",
        type=Path,
        default=Path("."),
        help="compose: the repository holding the router's Dockerfile (default: the current directory)",
    )
    render.add_argument("--router-image", help="router image (default lane-router:<version>)")
    render.add_argument("--vllm-image", help="vLLM image; '{version}' becomes the pool's vLLM version")
    _configure_k8s(render.add_argument_group("k8s", K8S_HELP))
    render.set_defaults(func=cmd_render)


K8S_HELP = (
    "Every object goes into one namespace: the profile finds each pool by its headless Service's DNS name "
    "there. A pool without --autoscale runs as many servers as the profile lists (one when it names them "
    "by discovery); with it, between MIN and MAX, adding servers while they average more than WAITING "
    f"(default {DEFAULT_WAITING:g}) requests in vLLM's queue (vllm:num_requests_waiting). 'hpa' renders a "
    "HorizontalPodAutoscaler, which needs a custom-metrics adapter "
    "(deploy/prometheus/prometheus-adapter.yml); 'keda' a KEDA ScaledObject querying --prometheus. "
    "Either way Prometheus must scrape the pool pods (deploy/prometheus/prometheus-k8s.yml), and a "
    "NetworkPolicy admits --prometheus-pods to them. --autoscale-on slo (or both) has a 'keda' autoscaler "
    "also, or instead, grow the pool while its worst lane misses its SLO for more than 5 % of its requests "
    "(the routers' lane:lane_router_slo_attainment:ratio_rate5m, deploy/prometheus/alerts.yml)."
)


def _configure_k8s(group: argparse._ArgumentGroup) -> None:
    defaults = DEFAULTS
    group.add_argument("--namespace", help=f"namespace of every object (default {defaults.namespace})")
    group.add_argument(
        "--cluster-domain", help=f"the cluster's DNS domain (default {defaults.cluster_domain})"
    )
    group.add_argument(
        "--autoscale",
        action="append",
        type=_parsed(parse_autoscaler),
        metavar="POOL=hpa|keda:MIN-MAX[:WAITING]",
        help="autoscale a pool, e.g. interactive=hpa:2-8 or batch=keda:1-4:8 (repeat for several pools)",
    )
    group.add_argument(
        "--autoscale-on",
        choices=SCALE_SIGNALS,
        help="what the autoscalers scale on: waiting (vLLM's queue, the default), slo (the pool's lanes' "
        "SLO attainment, keda only) or both",
    )
    keda = f"the Prometheus that KEDA queries (default {defaults.prometheus_url})"
    group.add_argument("--prometheus", metavar="URL", help=keda)
    scraper = defaults.scraper
    pods = f"{scraper.namespace}:" + ",".join(f"{k}={v}" for k, v in scraper.labels)
    group.add_argument(
        "--prometheus-pods",
        type=_parsed(parse_scraper),
        metavar="NAMESPACE:LABEL=VALUE[,LABEL=VALUE]",
        help=f"the Prometheus pods that may scrape autoscaled pools (default {pods})",
    )


def _parsed(parse: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse type: a malformed value exits 2 with the parser's reason."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return convert


def cmd_render(args: argparse.Namespace) -> int:
    misplaced = [flag for flag, dest in K8S_FLAGS.items() if getattr(args, dest) is not None]
    if args.target != "k8s" and misplaced:
        print(f"lane-router render {args.target}: {', '.join(misplaced)}: for k8s only", file=sys.stderr)
        return 2
    try:
        cfg = load_profile(args.config)
        if _refuse_guessable_keys(cfg, args):
            return 2
        text = render_text(args.target, cfg, args.device, args)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    except RenderError as err:
        print(f"lane-router render {args.target}: {args.config}: {err}", file=sys.stderr)
        return 2
    if args.out is None:
        sys.stdout.write(text)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / OUTPUT_FILES[args.target]
    target.write_text(text, encoding="utf-8")
    print(f"wrote {target}", file=sys.stderr)
    return 0


def _refuse_guessable_keys(cfg: ProfileConfig, args: argparse.Namespace) -> bool:
    # Only literal digests: the variables a deployment reads are filled in where it runs.
    issues = key_issues(cfg.keys)
    if issues:
        refused = f"to render {args.config}: a deployment listens on the network"
        print(refusal(f"lane-router render {args.target}", refused, issues), file=sys.stderr)
    return bool(issues)


def render_text(target: str, cfg: ProfileConfig, device: Device, args: argparse.Namespace) -> str:
    images: dict[str, Any] = {"vllm_image": args.vllm_image}
    if args.router_image:
        images["router_image"] = args.router_image
    if target == "vllm":
        return serve_script(serve_plan(cfg, device))
    if target == "compose":
        context = _relative(args.context, args.out)
        manifest = render_compose(cfg, ComposeOptions(device=device, context=context, **images))
    else:
        manifest = render_k8s(cfg, K8sOptions(device=device, **images, **_k8s_options(args)))
    return dump_all(manifest.documents, manifest.notes)


def _k8s_options(args: argparse.Namespace) -> dict[str, Any]:
    given = {
        "namespace": args.namespace,
        "cluster_domain": args.cluster_domain,
        "autoscalers": tuple(args.autoscale) if args.autoscale else None,
        "prometheus_url": args.prometheus,
        "scraper": args.prometheus_pods,
        "autoscale_on": args.autoscale_on,
    }
    return {name: value for name, value in given.items() if value is not None}


def _relative(context: Path, out: Path | None) -> str:
    """Compose resolves build contexts against the compose file's directory."""
    if out is None:
        return context.as_posix()
    return Path(os.path.relpath(context.resolve(), out.resolve())).as_posix()
