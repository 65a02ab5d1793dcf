"""The built-in reference inference server: a Llama-shaped PyTorch decoder with random weights
and a static KV cache (``model``, sizes in ``shapes``), a swappable kernel registry (``kernels``;
Triton defaults on a GPU in ``triton_kernels``), decode steps padded to batch buckets and replayed
from CUDA graphs (``graphs``), continuous batching with vLLM step annotations (``engine``), an
OpenAI-compatible aiohttp server with Prometheus ``/metrics`` (``server``, ``metrics``), and the
graph-versus-eager token check (``check``).
Run it with ``python -m engine.serve --model tiny --port 8000``."""
