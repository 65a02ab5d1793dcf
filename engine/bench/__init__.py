"""Serving benchmark: random dataset, load generator and metrics defined as `vllm bench serve` defines them."""
