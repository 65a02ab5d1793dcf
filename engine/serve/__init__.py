"""The built-in reference inference server: a Llama-shaped PyTorch decoder with random weights
(``model``), a swappable kernel registry (``kernels``), continuous batching with vLLM step
annotations (``engine``) and an OpenAI-compatible aiohttp server (``server``).
Run it with ``python -m engine.serve --model tiny --port 8000``."""
