"""The broker's event loop over proton-C (see engine.py) and the raw calls of the hot path (raw.py)."""

from broker.engine.engine import Conn, Engine, FastLink
from broker.engine.timers import Timer

__all__ = ["Conn", "Engine", "FastLink", "Timer"]
