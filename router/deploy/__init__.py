"""Deployments of a profile: `vllm serve` command lines, a docker compose file, Kubernetes objects.

Renderers are pure functions from a validated profile to data (`Manifest`, `ServePlan`); text is
made only at the edge (`router.deploy.cli`). Every server's arguments come from
`router.config.render.pool_serve_args`, the one renderer of a pool's `vllm:` block.
"""

from __future__ import annotations

from router.deploy.plan import Device, Manifest, PoolPlan, plan_pools
from router.deploy.render_compose import ComposeOptions, render_compose
from router.deploy.render_k8s import K8sOptions, render_k8s
from router.deploy.render_vllm import ServeCommand, ServePlan, serve_plan, serve_script

__all__ = [
    "ComposeOptions",
    "Device",
    "K8sOptions",
    "Manifest",
    "PoolPlan",
    "ServeCommand",
    "ServePlan",
    "plan_pools",
    "render_compose",
    "render_k8s",
    "serve_plan",
    "serve_script",
]
