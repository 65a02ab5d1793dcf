"""Where kernels and benchmark points run beyond this process: a Ray cluster (``ray_eval`` and
``raytasks``; batches of benchmark points, ``batch`` and ``batch_run``) and container images
(``container``); ``evaluators`` picks a non-local plan's evaluator for the modes, and the ``ray``
and ``container`` executors (``executors``, driven by the local ones of ``engine.jobs.executors``)
are registered into the job API's registry. Nothing here imports the job API, and only
``executors`` is above the modes. Importing this package does not import Ray or the docker
SDK; the modules that need them import them when they run."""
