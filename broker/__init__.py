"""Understudy broker core: a standalone AMQP 1.0 broker on qpid-proton (knows nothing of HA)."""

__version__ = "0.1.0"
