"""A backend's health, as its probes last judged it (router/fleet/health.py): one that is not DOWN
takes requests (router/lanes/poolgate.py `routable`). A module of its own so that the compiled gate can
read it without importing the pools that hold it."""

from __future__ import annotations

from enum import Enum


class Health(Enum):
    UNKNOWN = "unknown"
    UP = "up"
    DOWN = "down"
