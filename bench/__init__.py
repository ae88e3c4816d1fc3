"""Benchmark harness: our broker vs RabbitMQ 3.10 on the same machine, in the same run.

Run with `bench/run.sh` (or `.venv/bin/python -m bench`); see bench/README.md. Not part of CI.
"""
