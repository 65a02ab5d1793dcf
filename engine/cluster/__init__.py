"""Where kernels and benchmark points run beyond this process: a Ray cluster (``ray_eval``,
``batch``) and container images (``container``), behind the job API's executor protocol
(``executors``). Importing this package does not import Ray or the docker SDK; the modules that
need them import them when they run."""
