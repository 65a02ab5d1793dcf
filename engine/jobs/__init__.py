"""Runs as jobs: typed requests (``requests``), one entry point per mode (``modes``), and the job
API with its executors (``api``). Front ends use these and nothing below them."""

from engine.jobs.api import EXECUTORS, Job, attach, register_executor, submit
from engine.jobs.modes import JobOutcome, run_analyze, run_benchmark, run_compare, run_optimize, run_request, run_trace
from engine.jobs.requests import BenchmarkRequest, KernelRequest, LoopRequest, TraceRequest, parse_request

__all__ = ["EXECUTORS", "BenchmarkRequest", "Job", "JobOutcome", "KernelRequest", "LoopRequest", "TraceRequest", "attach",
           "parse_request", "register_executor", "run_analyze", "run_benchmark", "run_compare", "run_optimize",
           "run_request", "run_trace", "submit"]
